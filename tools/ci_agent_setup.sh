#!/usr/bin/env bash
# What the agent chapters' tests need on a fresh Debian machine (run as root, before pytest):
# bubblewrap for the default sandbox, and a Docker daemon for the Docker backend where one can start.
# The Docker tests skip with a printed reason when no daemon answers, so a failed Docker start is not an error.
set -uo pipefail
export DEBIAN_FRONTEND=noninteractive
need=()
command -v bwrap >/dev/null || need+=(bubblewrap)
command -v dockerd >/dev/null || need+=(docker.io)
[ -x /usr/bin/python3 ] || need+=(python3)  # the Python inside the sandboxes (the system one, under /usr)
if [ ${#need[@]} -gt 0 ]; then
    apt-get update -qq && apt-get install -y -qq "${need[@]}" >/dev/null \
        || echo "ci_agent_setup: apt-get install ${need[*]} failed"
fi
command -v bwrap >/dev/null || { echo "ci_agent_setup: bubblewrap is missing"; exit 1; }
# the sandbox needs bubblewrap 0.8 or later (--disable-userns, --size) and mount(8) for the workspace tmpfs quota
for flag in --disable-userns --as-pid-1 --size; do
    bwrap --help 2>&1 | grep -q -- "$flag" || { echo "ci_agent_setup: bwrap $(bwrap --version) lacks $flag (need 0.8+)"; exit 1; }
done
command -v mount >/dev/null || echo "ci_agent_setup: mount is missing (apt-get install mount): no workspace quota"
if docker info >/dev/null 2>&1; then
    echo "ci_agent_setup: a Docker daemon is already running"
elif command -v dockerd >/dev/null; then
    nohup dockerd >/tmp/apex3-dockerd.log 2>&1 &
    for _ in $(seq 30); do docker info >/dev/null 2>&1 && break; sleep 1; done
    if docker info >/dev/null 2>&1; then echo "ci_agent_setup: started dockerd (pid $!)"
    else echo "ci_agent_setup: dockerd did not start (the Docker tests will skip); see /tmp/apex3-dockerd.log"; fi
fi
exit 0
