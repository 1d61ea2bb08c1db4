#!/bin/sh
# PBS's mailer: the end-of-job mail with the job's report from the stats-server appended.
# On the PBS server host, as root:
#   install -m 755 mailer.sh /usr/local/sbin/ceems-pbs-mailer
#   qmgr -c "set server mailer = /usr/local/sbin/ceems-pbs-mailer"
# The server runs it as `mailer -f FROM "USER@HOST ..."` with its message on standard input;
# settings (SMTP server, stats-server URL, cluster-id if the stats-server does not name the
# complex after its PBS server) are the [mailprog] table of the config file. qstat (PBS_EXEC
# from /etc/pbs.conf) names the job's owner, whose report it is. Jobs ask for it with `-m e`.
exec /usr/bin/ceems mailprog --config.file=/etc/ceems/ceems.toml "$@"
