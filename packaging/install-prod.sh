#!/bin/sh
# The production install step, shared by the Dockerfile and tests/test_packaging.py so the test proves
# what the image runs: a fresh virtualenv at VENV, the production dependencies at exactly the versions
# of requirements/prod.lock (resolved inside dev.lock, so they are the versions CI tested), then the mkd
# wheel from WHEELS with no further resolution. No simulator, no embedded broker, no test tools.
#   usage: packaging/install-prod.sh WHEELS_DIR VENV [LOCK]
set -eu
wheels=$1
venv=$2
lock=${3:-"$(dirname "$0")/../requirements/prod.lock"}
python3 -m venv "$venv"
"$venv/bin/python" -m pip install --disable-pip-version-check -q -r "$lock"
"$venv/bin/python" -m pip install --disable-pip-version-check -q --no-deps "$wheels"/mkd-*.whl
"$venv/bin/python" -m pip check
