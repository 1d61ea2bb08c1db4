#!/bin/sh
# Slurm's MailProg with the job's report from the ceems stats-server appended, as jobstats
# does. In slurm.conf on the slurmctld host:
#   MailProg=/usr/local/sbin/ceems-mailprog.sh
# slurmctld runs it as the SlurmUser with no PATH, as `mailprog -s SUBJECT USER`; settings
# (SMTP server, stats-server URL) are the [mailprog] table of the config file, and the SMTP
# password, if any, is in a file that user reads (smtp.password-file).
exec /usr/bin/ceems mailprog --config.file=/etc/ceems/ceems.toml "$@"
