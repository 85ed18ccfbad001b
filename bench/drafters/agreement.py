"""Why a `lanes distill` drafter accepts what it accepts: teacher-forced agreement vs serving.

    python -m bench.drafters.agreement DIR [--prompts 3] [--new-tokens 48]

For held-out chat prompts: the target answers (greedy); then the training code's first draft
step, fed the target's real features, is compared with the target's next-next token over the
prompt and over the answer ("teacher-forced agreement"); then the engine serves the same prompt
with the drafter at k = 4 and counts the drafts it kept. CPU, no prompt cache.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
from safetensors.torch import load_file

from lanes import EngineConfig, SamplingParams, build_engine
from lanes.config import ModelConfig
from lanes.drafter.corpus import chat_prompts, pydoc_texts
from lanes.drafter.distill import EagleHead, hf_config
from lanes.models import open_checkpoint


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("drafter")
    ap.add_argument("--model", default=None)
    ap.add_argument("--prompts", type=int, default=3)
    ap.add_argument("--new-tokens", type=int, default=48)
    args = ap.parse_args()
    target = open_checkpoint(args.model)
    own = load_file(str(Path(args.drafter) / "model.safetensors"))
    cfg = ModelConfig.from_hf(hf_config(target.config, num_layers=1))
    head = EagleHead(cfg, target, own["eagle.vocab"], "cpu")
    with torch.no_grad():
        for name, t in own.items():
            if name != "eagle.vocab":
                head.p(name).copy_(t.float())
    plain = build_engine(checkpoint=target, config=EngineConfig(prompt_cache_bytes=0))
    drafted = build_engine(
        checkpoint=target,
        config=EngineConfig(
            prompt_cache_bytes=0, drafter=args.drafter, num_draft_tokens=4, adaptive_drafts=False
        ),
    )
    params = SamplingParams(max_tokens=args.new_tokens)
    for prompt in chat_prompts(args.prompts, seed=777, sources={"pydoc": pydoc_texts()}):
        out = plain.generate([prompt], params)[0]
        seq = out.prompt_ids + out.token_ids
        logits, feats = plain.prompt_logits_and_features([seq])[0]
        with torch.no_grad():
            guess = head.unrolled(torch.tensor([seq]), feats[None], 1)[0][0]
        pred = head.vocab[(guess @ head.embed[head.vocab].T).argmax(-1)]
        want = logits.argmax(-1)[1:]  # row r guesses the token at r + 2
        p = len(out.prompt_ids) - 2
        served = drafted.generate([prompt], params)[0]
        print(
            f"prompt {len(out.prompt_ids)} tokens, answer {len(out.token_ids)}: teacher-forced "
            f"agreement prompt {(pred[:p] == want[:p]).float().mean():.2f}, answer "
            f"{(pred[p:] == want[p:]).float().mean():.2f}; served: kept {served.num_accepted} of "
            f"{served.num_drafted} drafts, output equal {served.token_ids == out.token_ids}"
        )


if __name__ == "__main__":
    main()
