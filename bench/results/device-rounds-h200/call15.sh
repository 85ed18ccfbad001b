#!/usr/bin/env bash
# H200 call 15: only the GGUF's first 49 MB (.gg3) and the gguf wheel, for call 16 (call 8 had
# carried the old 45 MB part, and .gg2's 53 MB no longer fit beside the grown tree).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .gg3/*.whl || exit 1
mkdir -p /root/keep/cache && cp .gg3/p1 /root/keep/ && ls -la /root/keep
