"""Conversion entry points (`python -m converters.NAME --help`); the code they run lives in
cospec_local (cospec_local.formats, cospec_local.arbiter.file_format), which never imports this package.

    llama_to_gguf    a Hugging Face Llama folder + SentencePiece tokenizer -> GGUF (f32/f16/q8_0)
    gguf_to_torch    a llama-architecture GGUF -> a Hugging Face folder (dequantized, float32)
    truncate_gguf    a draft from a model's first N blocks
    arbiter_export   an arbiter folder's head -> head.onnx (for ONNX Runtime), checked against arbiter.gguf
"""
