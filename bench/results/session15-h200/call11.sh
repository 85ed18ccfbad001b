#!/usr/bin/env bash
# H200 call 11 (issue 18): call 10's exactness with the overlap guard switched off (negative
# control: rounds launched on top of a step that ends on a block boundary). Run as one command:
timeout 100 python3 -c "
import sys, runpy
import lanes.engine as e
e.Engine._snapshot_due = lambda self, steps: False  # negative control: rounds on top past a snapshot
sys.argv = ['exactness', '--shape', 'qwen3.5-2b-like', '--requests', '4', '--max-prompt', '512', '--modes', 'exact', '--out', '$OUT/exactness-qwen35-2b-turns-control.json']
runpy.run_module('bench.exactness', run_name='__main__')
" 2>&1 | grep -E "^(exact|fast)|Error" | tail -3
