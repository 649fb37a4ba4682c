"""A tiny random causal LM with a byte-level chat tokenizer, built offline.

Used by the fast tests and ``configs/debug.yaml``: no download, seconds to run,
same code paths (chat template, LoRA, teacher, rollout) as the real model.
"""
from __future__ import annotations

import torch

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHATML = (
    "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\n' + m['content'] + '<|im_end|>\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def byte_tokenizer():
    """Byte-level tokenizer (256 byte tokens + ChatML specials), no merges."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {ch: i for i, ch in enumerate(sorted(alphabet))}
    for s in SPECIALS:
        vocab[s] = len(vocab)
    core = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    core.decoder = decoders.ByteLevel()
    tok = PreTrainedTokenizerFast(tokenizer_object=core, bos_token=SPECIALS[0], eos_token=SPECIALS[2],
                                  pad_token=SPECIALS[0], additional_special_tokens=SPECIALS[1:2])
    tok.chat_template = CHATML
    return tok


def tiny_model_and_tokenizer(seed: int = 0, hidden: int = 32, layers: int = 2):
    """A seeded 2-layer Llama (width 32) over the byte tokenizer."""
    from transformers import LlamaConfig, LlamaForCausalLM

    tok = byte_tokenizer()
    cfg = LlamaConfig(
        vocab_size=len(tok), hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=8192,
        tie_word_embeddings=True, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = LlamaForCausalLM(cfg)
    return model.eval(), tok
