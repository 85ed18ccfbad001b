#!/usr/bin/env bash
# relay, part 1 of the default model's GGUF (gzip -1, split) kept for the next call
mkdir -p /root/keep && cp .gpu/p1/gpart.aa /root/keep/ && ls -l /root/keep
nvidia-smi --query-gpu=name,memory.total --format=csv
