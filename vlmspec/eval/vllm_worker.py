"""Run by a Python that has vLLM (its own environment: vLLM pins its own transformers), not imported by vlmspec.

`python vllm_worker.py JOB OUT`: greedy decoding of the job's image prompts with vLLM's offline engine, at most
`batch_size` sequences in flight (`max_num_seqs`), after one untimed warm-up call; writes each prompt's new token ids,
the timed seconds and vLLM's version to OUT (JSON). One process per batch size, so each engine goes with its process.
"""

import json
import sys
import time


def main(job_path: str, out_path: str) -> None:
    with open(job_path) as file:
        job = json.load(file)
    import vllm
    from PIL import Image

    llm = vllm.LLM(
        model=job["model"],
        dtype=job["dtype"],
        max_num_seqs=job["batch_size"],
        max_model_len=job["max_model_len"],
        limit_mm_per_prompt={"image": 1},
        seed=0,
    )
    params = vllm.SamplingParams(temperature=0.0, max_tokens=job["max_new_tokens"])
    requests = [
        {"prompt": item["prompt"], "multi_modal_data": {"image": Image.open(item["image"]).convert("RGB")}}
        for item in job["items"]
    ]
    llm.generate(requests[:2], params, use_tqdm=False)
    started = time.perf_counter()
    outputs = llm.generate(requests, params, use_tqdm=False)
    seconds = time.perf_counter() - started
    ids = [list(output.outputs[0].token_ids) for output in outputs]
    with open(out_path, "w") as file:
        json.dump({"seconds": seconds, "ids": ids, "version": vllm.__version__}, file)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
