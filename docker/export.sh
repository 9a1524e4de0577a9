#!/bin/sh
# The export image's entrypoint (installed as headwise-export): `headwise export`, with the model
# taken from the environment, so that Kubernetes and compose set it in one place.
#
#   MODEL     a Hub id or a folder in the container (mounted); empty or unset: the default model
#   REVISION  the Hub revision (branch, tag or commit); empty or unset: the Hub's default
#
# Arguments are passed on after those, so an explicit --model or --revision on the command line
# wins. The image's default arguments: --out /models/bundle --fp16 --int8. The bundle is written
# beside the others in a temporary folder, then renamed, so the output is a sub-folder of the
# mounted volume (/models/bundle), never the mount point itself.
set -eu
if [ -n "${REVISION:-}" ]; then
    set -- --revision "$REVISION" "$@"
fi
if [ -n "${MODEL:-}" ]; then
    set -- --model "$MODEL" "$@"
fi
# Not exec'd: as PID 1, Python would ignore SIGTERM (no handler), and `docker stop` or a pod's
# deletion would wait out the grace period. The shell stays PID 1 and passes the signal on.
headwise export "$@" &
child=$!
trap 'kill -TERM "$child" 2>/dev/null' TERM INT
status=0
wait "$child" || status=$?
if kill -0 "$child" 2>/dev/null; then  # the wait was cut short by the trap: wait for the end
    status=0
    wait "$child" || status=$?
fi
exit "$status"
