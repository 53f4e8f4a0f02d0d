"""Eager fallbacks left in the real models of the tests, as ``thunder_rs.examine`` counts them:
the tiny Hugging Face GPT-2, Llama and BERT with a padded batch and labels, the ResNet-18, and the
demo GPT. Target: none.

    python benchmarks/examine_models.py
"""

import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [os.path.join(ROOT, "tests"), os.path.join(ROOT, "examples")]

import gpt  # noqa: E402
import thunder_rs  # noqa: E402
from test_cnn import ResNet18, images  # noqa: E402
from test_hf_models import MODELS, padded_batch, tiny_model  # noqa: E402


def main() -> None:
    for name in MODELS:
        print(f"{name:8} {thunder_rs.examine(tiny_model(name), **padded_batch(name, 'left')).fallbacks}")
    print(f"{'resnet18':8} {thunder_rs.examine(ResNet18(), images(0)[0]).fallbacks}")
    config = gpt.GPTConfig()
    print(f"{'demo gpt':8} {thunder_rs.examine(gpt.GPT(config), gpt.random_tokens(config, 2, 16)).fallbacks}")


if __name__ == "__main__":
    main()
