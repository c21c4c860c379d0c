"""lmms-eval's own `openai_compatible` model sending local items to an OpenAI-compatible server (`vlmspec serve`).

Run it with the Python of an environment where lmms-eval is installed (it is not a vlmspec dependency):

    python scripts/lmms_eval_client.py --base-url http://127.0.0.1:8000/v1 --model vlmspec-demo \\
        --image vlmspec/demo_models/samples/sample.png --video vlmspec/demo_models/samples/sample.mp4

It asks a text question, an image question and a video question (lmms-eval sends the video as base64 frames, one
`image_url` each) through the class's own `generate_until`. lmms-eval's evaluator would build the requests from a
task's YAML; here `task_dict` and the `Instance`s are filled in by hand, the only parts not lmms-eval's own.
Exits 1 if any request failed (lmms-eval returns a failed request's text as `[LMMS_EVAL_REQUEST_FAILED ...]`).
"""

from __future__ import annotations

import argparse
import os
import sys

TASK, SPLIT = "local_items", "test"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base-url", required=True, help="the server's /v1 URL")
    parser.add_argument("--model", required=True, help="the served model name (avoid o1/o3: read as reasoning models)")
    parser.add_argument("--api-key", default=os.environ.get("OPENAI_API_KEY", "unused"))
    parser.add_argument("--image", required=True)
    parser.add_argument("--video", required=True)
    parser.add_argument("--max-frames", type=int, default=10, help="frames lmms-eval samples from the video")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    args = parser.parse_args()

    from lmms_eval.api.instance import Instance
    from lmms_eval.models import get_model

    model_class = get_model("openai_compatible", force_simple=True)
    model = model_class(
        model_version=args.model,
        base_url=args.base_url,
        api_key=args.api_key,
        max_frames_num=args.max_frames,
        max_retries=1,
        num_concurrent=1,
    )
    docs = [
        {"question": "Describe a picture of coloured shapes.", "media": []},
        {"question": "Describe the image in detail.", "media": [os.path.abspath(args.image)]},
        {"question": "Describe the video in detail.", "media": [os.path.abspath(args.video)]},
    ]
    model.task_dict = {TASK: {SPLIT: docs}}

    def doc_to_visual(doc: dict) -> list[str]:
        return doc["media"]

    generation = {"max_new_tokens": args.max_new_tokens, "temperature": 0}
    requests = [
        Instance(
            request_type="generate_until",
            arguments=(doc["question"], dict(generation), doc_to_visual, doc_id, TASK, SPLIT),
            idx=0,
            metadata={"task": TASK, "doc_id": doc_id, "repeats": 1},
        )
        for doc_id, doc in enumerate(docs)
    ]
    answers = model.generate_until(requests)
    failed = 0
    for kind, doc, answer in zip(("text", "image", "video"), docs, answers, strict=True):
        text = str(getattr(answer, "text", answer))
        failed += text.startswith("[LMMS_EVAL_REQUEST_FAILED")
        print(f"[{kind}] {doc['question']}\n  {text}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
