"""Model files: the code of the conversions. Their command-line entry points are the top-level
converters/ package (`python -m converters.NAME`).

- llama_gguf_writer.py: a Hugging Face Llama as a GGUF llama.cpp loads;
- gguf_llama_reader.py: a Llama GGUF back into torch, dequantized;
- gguf_edit.py: copies of a GGUF with fewer layers or other metadata (no torch);
- spm_tokenizer.py: a SentencePiece BPE tokenizer llama.cpp reads;
- tiny_models.py: tiny random models of every architecture, by llama.cpp's own converter.
"""
