#!/bin/bash
# The system test's fixtures, made with the image (image.sh runs this in the image's root, /proc
# mounted): the app's Unix group and its users, each scenario's group directory with its store and
# settings as the app's first process leaves them, the timer's drop-in, and the units the power-loss
# boots start. None of it is under test, and in the guest, under software emulation, it cost every run
# a minute: each store and setting a Swift process starting, each unit change a reload of systemd.
set -eu
here=/usr/local/lib/tributary-systest
. "$here/lib.sh"
. "$here/scenarios.sh"
. "$here/network.sh"
. "$here/power-loss.sh"

fixture_functional
fixture_network
fixture_power_loss
