#!/usr/bin/env bash
# Installs the Debian packages lumen builds and tests with (as root, on a
# fresh machine); does nothing when they are all present.
set -euo pipefail
pkgs=(build-essential cmake pkg-config libjansson-dev libpcre2-dev libutf8proc-dev libxxhash-dev libmicrohttpd-dev libedit-dev libopenblas-dev clang libclang-rt-14-dev
  chromium) # chromium: tests/web drives the chat page in it
# ip (iproute2): tests/agents bring loopback up in a network namespace of their own
pkgs+=(iproute2)
missing=()
for p in "${pkgs[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "installing: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
# Node.js and npm run the end-to-end server tests (tests/e2e, the openai SDK);
# Debian's packages only when the machine has none.
if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
  echo "installing: nodejs npm"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends nodejs npm >/dev/null
fi
