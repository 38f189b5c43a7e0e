/*
 * chat.c — ChatML and Llama 3 chat templates (see chat.h).
 */
#include "runner/chat.h"

#include "runner/error.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *mkv_chat_template_name(mkv_chat_template_t t)
{
    switch (t) {
    case MKV_CHAT_CHATML: return "chatml";
    case MKV_CHAT_LLAMA3: return "llama3";
    default: return "none";
    }
}

/* The id of a special token when the tokenizer encodes its text to exactly that one token
 * (special tokens are matched whole), else -1. */
static int32_t special_id(const mkv_tokenizer_t *tok, const char *text)
{
    char err[MKV_ERR_LEN];
    int32_t *ids = NULL, n = 0, id = -1;
    if (mkv_tokenizer_encode(tok, text, strlen(text), 0, &ids, &n, err) == MKV_STATUS_OK && n == 1)
        id = ids[0];
    free(ids);
    return id;
}

mkv_chat_template_t mkv_chat_detect(const mkv_tokenizer_t *tok)
{
    if (!tok) return MKV_CHAT_NONE;
    if (special_id(tok, "<|im_start|>") >= 0 && special_id(tok, "<|im_end|>") >= 0)
        return MKV_CHAT_CHATML;
    if (special_id(tok, "<|start_header_id|>") >= 0 && special_id(tok, "<|end_header_id|>") >= 0 &&
        special_id(tok, "<|eot_id|>") >= 0)
        return MKV_CHAT_LLAMA3;
    return MKV_CHAT_NONE;
}

int32_t mkv_chat_end_token(const mkv_tokenizer_t *tok, mkv_chat_template_t t)
{
    switch (t) {
    case MKV_CHAT_CHATML: return special_id(tok, "<|im_end|>");
    case MKV_CHAT_LLAMA3: return special_id(tok, "<|eot_id|>");
    default: return -1;
    }
}

mkv_status_t mkv_chat_encode(const mkv_tokenizer_t *tok, mkv_chat_template_t t, const char *user,
                             int32_t **out, int32_t *n_out, char *err)
{
    const char *pre, *post;
    switch (t) {
    case MKV_CHAT_CHATML:
        pre = "<|im_start|>user\n";
        post = "<|im_end|>\n<|im_start|>assistant\n";
        break;
    case MKV_CHAT_LLAMA3:
        /* Llama 3's template begins with its BOS and adds no other. */
        pre = special_id(tok, "<|begin_of_text|>") >= 0
                  ? "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\n"
                  : "<|start_header_id|>user<|end_header_id|>\n\n";
        post = "<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n";
        break;
    default:
        snprintf(err, MKV_ERR_LEN,
                 "no known chat template for this model (its tokenizer has neither ChatML's "
                 "<|im_start|>/<|im_end|> nor Llama 3's header tokens)");
        return MKV_STATUS_INVALID_ARGUMENT;
    }
    const size_t len = strlen(pre) + strlen(user) + strlen(post);
    char *text = malloc(len + 1);
    if (!text) {
        snprintf(err, MKV_ERR_LEN, "out of memory");
        return MKV_STATUS_OUT_OF_MEMORY;
    }
    snprintf(text, len + 1, "%s%s%s", pre, user, post);
    const mkv_status_t st = mkv_tokenizer_encode(tok, text, len, 0, out, n_out, err);
    free(text);
    return st;
}
