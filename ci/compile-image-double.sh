#!/bin/bash
# Regenerate ci/requirements-image-double.txt (hashed, Python 3.12, x86_64 Linux) from its
# .in file with the project's pinned uv (scripts/run-tests installs it into the cache).
set -euo pipefail
cd "$(dirname "$0")"
cache=$(python3 -c 'import sys; sys.path.insert(0, "../scripts"); from patchset import paths; print(paths.cache_dir())')
uv=$(ls -d "$cache"/venvs/uv-*/bin/uv | head -1)
UV_CACHE_DIR="$cache/uv-cache" "$uv" pip compile --quiet --python-version 3.12 \
  --python-platform x86_64-manylinux_2_28 --generate-hashes --no-header \
  -o requirements-image-double.txt requirements-image-double.in
{ echo "# The lent machine's image, doubled for the rehearsal: see requirements-image-double.in."
  echo "# Made by ci/compile-image-double.sh (uv pip compile)."
  cat requirements-image-double.txt; } > requirements-image-double.txt.new
mv requirements-image-double.txt.new requirements-image-double.txt
