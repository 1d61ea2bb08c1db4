getent group ceems >/dev/null || groupadd -r ceems
getent passwd ceems >/dev/null || useradd -r -g ceems -d /nonexistent -s /sbin/nologin -c "ceems daemons" ceems
for link in ceems_exporter ceems_api_server redfish_proxy ceems_lb ceems_tool ceems_k8s_admission_controller; do
    ln -sf ceems "/usr/bin/$link"
done
chgrp ceems /etc/ceems/ceems.toml /etc/ceems/config.yml && chmod 0640 /etc/ceems/ceems.toml /etc/ceems/config.yml
chgrp ceems /usr/bin/cacct && chmod 2755 /usr/bin/cacct
