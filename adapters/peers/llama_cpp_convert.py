"""llama.cpp's own converter (``convert_hf_to_gguf.py``) on one of the
architectures' checkpoints: the GGUF a user of llama.cpp has, which the
Rust loader must read as the HF checkpoint it came from (MODEL-17).

Run by ``cargo xtask architectures``: ``PYTHON llama_cpp_convert.py
LLAMA_CPP_SRC DEPS HF_DIR OUT.gguf``, with the llama.cpp source that
llama-cpp-python's PyPI release carries and ``DEPS`` a folder holding the
converter's one dependency the peers' environment lacks (``sentencepiece``,
pinned by the caller). Tensors are written as f32 (``--outtype f32``), so
the file holds the checkpoint's values exactly.

One thing is told to the converter rather than found: it names a byte-level
BPE's pre-tokenizer by hashing its tokens of a fixed text, and refuses a
tokenizer it has not seen. The checkpoints' 48-id tokenizer is new to it,
and its pre-tokenizer is GPT-2's (byte-level with GPT-2's regex), which
llama.cpp calls ``gpt-2``; nothing else of the converter is changed.
"""

import os
import sys


def main(src, deps, hf_dir, out):
    sys.path[:0] = [deps, os.path.join(src, "gguf-py"), src]
    from conversion import base

    base.TextModel.get_vocab_base_pre = lambda self, tokenizer: "gpt-2"
    import convert_hf_to_gguf

    sys.argv = ["convert_hf_to_gguf.py", hf_dir, "--outfile", out, "--outtype", "f32"]
    convert_hf_to_gguf.main()


if __name__ == "__main__":
    main(*sys.argv[1:5])
