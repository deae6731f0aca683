#ifndef TRIBUTARY_CSYSTEMD_SHIM_H
#define TRIBUTARY_CSYSTEMD_SHIM_H
// Debian's libsystemd-dev. sd_notify(3): "If the $NOTIFY_SOCKET environment variable is not set,
// and hence status notifications are not supported, sd_notify() returns 0" — so the agent calls it
// unconditionally and it is a no-op outside systemd.
#include <systemd/sd-daemon.h>
#endif
