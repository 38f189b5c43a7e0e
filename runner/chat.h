/*
 * chat.h — the chat templates mixkv knows (ChatML, as SmolLM2 and Qwen2 use it, and Llama 3's),
 * recognised from the special tokens a model's tokenizer defines. One user turn, then the
 * assistant's header, ready for generation. Not a template engine: a model whose tokenizer
 * defines neither set of tokens has no known template.
 */
#ifndef MKV_ENGINE_CHAT_H
#define MKV_ENGINE_CHAT_H

#include "runner/tokenizer.h"

#include <stdint.h>

typedef enum mkv_chat_template {
    MKV_CHAT_NONE = 0,
    MKV_CHAT_CHATML, /* <|im_start|>user\n...<|im_end|>\n<|im_start|>assistant\n */
    MKV_CHAT_LLAMA3, /* <|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\n...<|eot_id|>
                        <|start_header_id|>assistant<|end_header_id|>\n\n */
} mkv_chat_template_t;

/* "chatml", "llama3" or "none". */
const char *mkv_chat_template_name(mkv_chat_template_t t);

/* The template whose special tokens the tokenizer matches whole (each encodes to one token). */
mkv_chat_template_t mkv_chat_detect(const mkv_tokenizer_t *tok);

/* The token that ends the assistant's turn (<|im_end|>, <|eot_id|>), or -1. */
int32_t mkv_chat_end_token(const mkv_tokenizer_t *tok, mkv_chat_template_t t);

/* One user message wrapped in the template, as token ids (the template's own BOS included,
 * no other BOS added). *out is malloc'ed. INVALID_ARGUMENT for MKV_CHAT_NONE. */
mkv_status_t mkv_chat_encode(const mkv_tokenizer_t *tok, mkv_chat_template_t t, const char *user,
                             int32_t **out, int32_t *n_out, char *err);

#endif /* MKV_ENGINE_CHAT_H */
