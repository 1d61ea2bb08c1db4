# $1 is 0 on erase, 1 on upgrade: keep the links on upgrade.
if [ "$1" = 0 ]; then
    rm -f /usr/bin/ceems_exporter /usr/bin/ceems_api_server /usr/bin/redfish_proxy /usr/bin/ceems_lb /usr/bin/ceems_tool /usr/bin/ceems_k8s_admission_controller
fi
