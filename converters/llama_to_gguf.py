"""Convert a Hugging Face LlamaForCausalLM folder plus a SentencePiece tokenizer into a GGUF.

    python -m converters.llama_to_gguf HF_DIR TOKENIZER.model OUT.gguf --type q8_0

The converter is cospec_local.formats.llama_gguf_writer (its docstring says what it follows).
"""
from cospec_local.formats.llama_gguf_writer import main

if __name__ == "__main__":
    main()
