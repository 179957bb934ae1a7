#!/bin/sh
# The image's entrypoint, shared by Dockerfile and docker/Dockerfile.cpu.
#
#   (no arguments) | serve [FLAGS]   sluicegate serve, configured by SLUICEGATE_* variables
#   --flag ...                       sluicegate serve --flag ...
#   model prepare [--force]          sluicegate model prepare
#   anything else                    run as given (a shell, python, ...)
#
# Every branch ends in `exec`: the server replaces this shell, so the SIGTERM of
# `docker stop` reaches it and starts its graceful drain (see SLUICEGATE_SHUTDOWN_TIMEOUT).
set -eu

if [ "$#" -eq 0 ]; then
    set -- serve
fi

case "$1" in
    serve | model)
        exec sluicegate "$@"
        ;;
    -*)
        exec sluicegate serve "$@"
        ;;
    *)
        exec "$@"
        ;;
esac
