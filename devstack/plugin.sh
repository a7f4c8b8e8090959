#!/bin/bash
#
# devstack/plugin.sh - the vmar-openstack devstack plugin.
#
# Sourced by devstack with the mode and phase as arguments:
#   stack pre-install|install|post-config|extra|test-config, unstack, clean
# See doc/source/install/devstack.rst.

# shellcheck source=devstack/lib/vmar
source "$VMAR_DIR/devstack/lib/vmar"

if [[ "$1" == "stack" && "$2" == "pre-install" ]]; then
    echo_summary "Installing the packages vmar-openstack needs"
    install_vmar_packages

elif [[ "$1" == "stack" && "$2" == "install" ]]; then
    echo_summary "Installing vmar-openstack"
    install_vmar

elif [[ "$1" == "stack" && "$2" == "post-config" ]]; then
    echo_summary "Configuring vmar-openstack"
    configure_vmar

elif [[ "$1" == "stack" && "$2" == "extra" ]]; then
    echo_summary "Starting vmar-openstack"
    start_vmar
fi

if [[ "$1" == "unstack" ]]; then
    stop_vmar
fi

if [[ "$1" == "clean" ]]; then
    cleanup_vmar
fi
