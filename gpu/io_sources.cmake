# Sources of the model-file and text side of gpu/ (GGUF, ggml types, tokenizer, chat templates).
# Included by gpu/CMakeLists.txt, which builds them into weft_gpu together with the compute sources.
set(WEFT_GPU_IO_SOURCES
  ${CMAKE_CURRENT_LIST_DIR}/chat_template.cpp
  ${CMAKE_CURRENT_LIST_DIR}/direct_file.cpp
  ${CMAKE_CURRENT_LIST_DIR}/ggml_types.cpp
  ${CMAKE_CURRENT_LIST_DIR}/gguf.cpp
  ${CMAKE_CURRENT_LIST_DIR}/gguf_writer.cpp
  ${CMAKE_CURRENT_LIST_DIR}/tiny_model.cpp
  ${CMAKE_CURRENT_LIST_DIR}/tokenizer.cpp
  ${CMAKE_CURRENT_LIST_DIR}/internal/gguf_mapping.cpp
  ${CMAKE_CURRENT_LIST_DIR}/internal/tokenizer_bpe.cpp
  ${CMAKE_CURRENT_LIST_DIR}/internal/tokenizer_pretokenize.cpp
  ${CMAKE_CURRENT_LIST_DIR}/internal/tokenizer_unicode.cpp
  ${CMAKE_CURRENT_LIST_DIR}/internal/tokenizer_unicode_data.cpp
)
