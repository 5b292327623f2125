"""A black-box agent: any program that speaks the OpenAI chat API. It knows nothing about Forge — only a base URL
and an API key (OPENAI_API_KEY) — and is trained by pointing it at the gateway:

    python -m forge.examples.blackbox_agent --base-url http://127.0.0.1:8000/s/SESSION/v1 \\
        --messages '[{"role": "user", "content": "Compute 2 + 3."}]'

It prints the model's final reply on stdout.
"""

import argparse
import json

from openai import OpenAI


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base-url", required=True)
    parser.add_argument("--messages", required=True, help="the conversation, as JSON")
    parser.add_argument("--model", default="forge-tiny")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--temperature", type=float, default=1.0)
    args = parser.parse_args()
    client = OpenAI(base_url=args.base_url)
    reply = client.chat.completions.create(model=args.model, messages=json.loads(args.messages),
                                           max_tokens=args.max_tokens, temperature=args.temperature)
    print(reply.choices[0].message.content or "")


if __name__ == "__main__":
    main()
