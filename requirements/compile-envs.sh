#!/bin/bash
# Regenerate the hashed per-release environments requirements/<env>.txt from in/<env>.in.
#   requirements/compile-envs.sh [ENV...]     (default: every in/torch*.in)
# Needs pip-tools (tested with pip-tools 7.6.2 on pip 23.2.1, Python 3.11, Linux x86_64):
#   python3 -m venv /tmp/piptools && /tmp/piptools/bin/pip install pip-tools==7.6.2
#   PIP_COMPILE=/tmp/piptools/bin/pip-compile requirements/compile-envs.sh
# PIP_FIND_LINKS=" " hides a machine's find-links folder of local wheels (here
# /opt/wheels holds torch-2.13.0+cpu, which would win over PyPI's torch==2.13.0 and
# which PyPI's torchvision 0.28.0 cannot import beside).
set -euo pipefail
cd "$(dirname "$0")"
PIP_COMPILE=${PIP_COMPILE:-pip-compile}
if [ $# -eq 0 ]; then set -- $(cd in && ls torch*.in | sed 's/\.in$//'); fi
for env in "$@"; do
  PIP_FIND_LINKS=" " "$PIP_COMPILE" --quiet --generate-hashes --allow-unsafe \
    --no-strip-extras --no-emit-index-url --no-emit-find-links \
    --custom-compile-command "requirements/compile-envs.sh $env" \
    --output-file "$env.txt" "in/$env.in"
  { sed -n '1s/^# /# Serves /p' "in/$env.in"
    echo "# Install: pip install --require-hashes --no-deps -r requirements/$env.txt"
    echo "# Made from requirements/in/$env.in by requirements/compile-envs.sh (pip-compile)."
    cat "$env.txt"; } > "$env.txt.new"
  mv "$env.txt.new" "$env.txt"
done
