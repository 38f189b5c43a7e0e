/*
 * needle.c — `mixkv needle`: needle-in-a-haystack retrieval, FP16 baseline against mixkv. A
 * short fact (a secret number) is inserted at chosen depths of long text (essays), a question
 * about it is asked at the end, and the model answers greedily; the answer is right when the
 * first number in it is the secret one. The whole haystack goes through the prompt phase, so
 * what is tested is whether the prompt-phase policy keeps the tokens that matter far back.
 *
 * The prompt is the model's chat template around one user message where the tokenizer defines
 * one (runner/chat.h), else plain text ending in "Answer: The secret number is". Lengths are
 * prompt lengths in tokens (the haystack is cut to fit; the actual length is reported).
 */
#include "common/error.h"
#include "runner/chat.h"
#include "runner/tokenizer.h"
#include "tools/cli.h"
#include "tools/model_opts.h"

#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define CMD "needle"
#define MAX_GRID 32
#define N_MODES 2

typedef struct needle_opts {
    const char *model, *haystack, *json_path;
    int32_t lengths[MAX_GRID], n_lengths;
    double depths[MAX_GRID];
    int32_t n_depths;
    int32_t trials, max_new, threads;
    int64_t seed;
    int plain, quiet;
    mkv_policy_opts_t policy;
} needle_opts_t;

void mkv_needle_usage(FILE *f)
{
    fprintf(f,
            "usage: mixkv needle --model PATH --haystack DIR|FILE [OPTIONS]\n"
            "\n"
            "Needle-in-a-haystack retrieval through the FP16 paged baseline and through mixkv:\n"
            "a sentence with a secret number is inserted at each depth of essay text cut to each\n"
            "length, a question about it ends the prompt, and the model answers greedily. An\n"
            "answer is right when its first number is the secret one. Reports the fraction\n"
            "right per length and depth for both modes, and mixkv's memory ratio.\n"
            "\n"
            "options (defaults in brackets):\n"
            "  --model PATH        a model folder or a GGUF file (required)\n"
            "  --haystack DIR|FILE text to hide the needle in: a file, or a directory whose\n"
            "                      regular files are joined in name order (required)\n"
            "  --lengths L,L,...   prompt lengths in tokens [1024,2048,4096]\n"
            "  --depths D,D,...    needle depths as fractions of the haystack [0,0.25,0.5,0.75,1]\n"
            "  --trials N          needles per length and depth (different numbers and text) [2]\n"
            "  --max-new N         answer tokens at most [24]\n"
            "  --plain             no chat template, even where the model has one\n"
            "  --seed N            seed of the secret numbers [1]\n"
            MKV_POLICY_OPTS_HELP
            "  --threads N         forward-pass threads [one per core]\n"
            "  --json FILE         write the results as JSON ('-': stdout)\n"
            "  --quiet             no progress line\n"
            "  -h, --help          this help\n"
            "\n"
            "exit status: 0 success, 1 a run failed, 2 bad usage or input.\n");
}

/* "a,b,c" into numbers in [lo, hi]. */
static int parse_list(const char *what, const char *text, double lo, double hi, int integer,
                      double *out, int32_t *n)
{
    *n = 0;
    const char *p = text;
    while (*p) {
        char *end;
        errno = 0;
        const double v = strtod(p, &end);
        if (end == p || errno || !(v >= lo && v <= hi) || (integer && v != floor(v)) ||
            (*end && *end != ',')) {
            mkv_cli_error(CMD, "%s: '%s' is not a list of %s in [%g, %g]", what, text,
                          integer ? "integers" : "numbers", lo, hi);
            return -1;
        }
        if (*n == MAX_GRID) {
            mkv_cli_error(CMD, "%s: at most %d values", what, MAX_GRID);
            return -1;
        }
        out[(*n)++] = v;
        p = *end ? end + 1 : end;
    }
    if (*n == 0) {
        mkv_cli_error(CMD, "%s: no values", what);
        return -1;
    }
    return 0;
}

static int parse(int argc, char **argv, needle_opts_t *o)
{
    for (int i = 1; i < argc; i++) {
        const char *v;
        int m;
        double tmp[MAX_GRID];
        if (mkv_cli_is_help(argv[i])) {
            mkv_needle_usage(stdout);
            return 1;
        }
        if ((m = mkv_policy_opts_parse(CMD, argc, argv, &i, &o->policy)) != 0) {
            if (m < 0) return -1;
            continue;
        }
#define STR_OPT(name, field)                                                                   \
    if ((m = mkv_cli_option(CMD, argc, argv, &i, name, 1, 0, &v)) != 0) {                      \
        if (m < 0) return -1;                                                                  \
        o->field = v;                                                                          \
        continue;                                                                              \
    }
        STR_OPT("--model", model)
        STR_OPT("--haystack", haystack)
        STR_OPT("--json", json_path)
#undef STR_OPT
        if ((m = mkv_cli_option(CMD, argc, argv, &i, "--lengths", 1, 0, &v)) != 0) {
            if (m < 0 || parse_list("--lengths", v, 16, 1 << 20, 1, tmp, &o->n_lengths) < 0) return -1;
            for (int32_t k = 0; k < o->n_lengths; k++) o->lengths[k] = (int32_t)tmp[k];
            continue;
        }
        if ((m = mkv_cli_option(CMD, argc, argv, &i, "--depths", 1, 0, &v)) != 0) {
            if (m < 0 || parse_list("--depths", v, 0.0, 1.0, 0, o->depths, &o->n_depths) < 0) return -1;
            continue;
        }
        if ((m = mkv_cli_option(CMD, argc, argv, &i, "--trials", 1, 0, &v)) != 0) {
            if (m < 0 || mkv_cli_parse_i32(CMD, "--trials", v, 1, 1000, &o->trials) < 0) return -1;
            continue;
        }
        if ((m = mkv_cli_option(CMD, argc, argv, &i, "--max-new", 1, 0, &v)) != 0) {
            if (m < 0 || mkv_cli_parse_i32(CMD, "--max-new", v, 1, 256, &o->max_new) < 0) return -1;
            continue;
        }
        if ((m = mkv_cli_option(CMD, argc, argv, &i, "--threads", 1, 0, &v)) != 0) {
            if (m < 0 || mkv_cli_parse_i32(CMD, "--threads", v, 1, 256, &o->threads) < 0) return -1;
            continue;
        }
        if ((m = mkv_cli_option(CMD, argc, argv, &i, "--seed", 1, 0, &v)) != 0) {
            if (m < 0 || mkv_cli_parse_i64(CMD, "--seed", v, 0, INT64_MAX, &o->seed) < 0) return -1;
            continue;
        }
        if (!strcmp(argv[i], "--plain")) { o->plain = 1; continue; }
        if (!strcmp(argv[i], "--quiet")) { o->quiet = 1; continue; }
        mkv_cli_error(CMD, "unknown argument '%s' (see 'mixkv needle --help')", argv[i]);
        return -1;
    }
    if (!o->model || !o->haystack) {
        mkv_cli_error(CMD, "--model PATH and --haystack DIR|FILE are required");
        return -1;
    }
    return mkv_cli_check_writable(CMD, "--json", o->json_path);
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Appends a file's text, then "\n\n", to *buf. */
static int append_file(char **buf, size_t *len, const char *path)
{
    size_t n = 0;
    char *t = mkv_cli_read_file(CMD, path, &n);
    if (!t) return -1;
    char *g = realloc(*buf, *len + n + 3);
    if (!g) {
        free(t);
        mkv_cli_error(CMD, "out of memory reading the haystack");
        return -1;
    }
    memcpy(g + *len, t, n);
    memcpy(g + *len + n, "\n\n", 3);
    *buf = g;
    *len += n + 2;
    free(t);
    return 0;
}

/* The haystack's text: a file, or a directory's regular files in name order. */
static char *read_haystack(const char *path, size_t *len)
{
    char *buf = NULL;
    *len = 0;
    struct stat sb;
    if (stat(path, &sb) != 0 || !S_ISDIR(sb.st_mode)) return append_file(&buf, len, path) < 0 ? NULL : buf;
    DIR *dir = opendir(path);
    if (!dir) {
        mkv_cli_error(CMD, "cannot open the directory '%s': %s", path, strerror(errno));
        return NULL;
    }
    char **names = NULL, full[4096];
    int32_t n = 0, cap = 0, rc = 0;
    for (struct dirent *e; rc == 0 && (e = readdir(dir)) != NULL;) {
        snprintf(full, sizeof full, "%s/%s", path, e->d_name);
        if (e->d_name[0] == '.' || stat(full, &sb) != 0 || !S_ISREG(sb.st_mode)) continue;
        if (n == cap) {
            char **g = realloc(names, (size_t)(cap = cap ? 2 * cap : 64) * sizeof *g);
            if (!g) rc = -1;
            else names = g;
        }
        if (rc == 0 && !(names[n++] = strdup(e->d_name))) rc = -1;
    }
    closedir(dir);
    if (rc == 0 && n == 0) {
        mkv_cli_error(CMD, "the directory '%s' holds no regular files", path);
        rc = -1;
    }
    if (rc == 0) qsort(names, (size_t)n, sizeof *names, cmp_str);
    for (int32_t i = 0; i < n; i++) {
        snprintf(full, sizeof full, "%s/%s", path, names[i]);
        if (rc == 0 && append_file(&buf, len, full) < 0) rc = -1;
        free(names[i]);
    }
    free(names);
    if (rc < 0) {
        free(buf);
        return NULL;
    }
    return buf;
}

/* The first run of decimal digits in text, as a number; -1 when there is none. */
static long first_number(const char *text)
{
    while (*text && !isdigit((unsigned char)*text)) text++;
    if (!*text) return -1;
    long v = 0;
    for (int k = 0; isdigit((unsigned char)*text) && k < 12; text++, k++) v = 10 * v + (*text - '0');
    return v;
}

typedef struct cell {
    int32_t right[N_MODES];
    int32_t trials;
    int64_t prompt_tokens;      /* summed over trials */
    double memory_ratio_sum;    /* mixkv's bytes in use / FP16 bytes at the answer's end */
    int32_t answers_equal;      /* trials where both modes gave the same answer tokens */
} cell_t;

typedef struct ctx {
    const mkv_model_t *model;
    const mkv_tokenizer_t *tok;
    mkv_chat_template_t chat;
    int32_t end_token;
    mkv_cache_t *cache[N_MODES];
    mkv_forward_ws_t *ws;
    float *logits; /* [vocab] */
} ctx_t;

/* Greedy answer to prompt[n] through cache c: up to max_new tokens (stops at EOS or the
 * template's end token) into out; *n_out their count. */
static mkv_status_t answer(ctx_t *x, mkv_cache_t *c, const int32_t *prompt, int32_t n,
                           int32_t max_new, int32_t *out, int32_t *n_out, double *mem_ratio)
{
    const int32_t V = x->model->cfg.vocab;
    int32_t slot;
    mkv_status_t st = mkv_cache_admit(c, n, &slot);
    if (st != MKV_STATUS_OK) return mkv_fail_global(st, "%s", mkv_cache_last_error(c));
    if ((st = mkv_model_prefill(x->model, c, slot, prompt, n, NULL, x->logits, x->ws)) != MKV_STATUS_OK)
        return st;
    *n_out = 0;
    for (;;) {
        int32_t best = 0;
        for (int32_t i = 1; i < V; i++)
            if (x->logits[i] > x->logits[best]) best = i;
        if (best == x->model->cfg.eos || best == x->end_token) break;
        out[(*n_out)++] = best;
        if (*n_out == max_new) break;
        if ((st = mkv_model_decode(x->model, c, 1, &slot, &best, x->logits, x->ws)) != MKV_STATUS_OK)
            return st;
    }
    mkv_cache_stats_t cs;
    mkv_cache_stats(c, &cs);
    *mem_ratio = (double)cs.bytes_in_use / (double)cs.bytes_fp16;
    if ((st = mkv_cache_release(c, slot, NULL)) != MKV_STATUS_OK)
        return mkv_fail_global(st, "%s", mkv_cache_last_error(c));
    return MKV_STATUS_OK;
}

/* Encodes a user message (the chat template, or plain text). */
static mkv_status_t encode_message(const ctx_t *x, const char *msg, int32_t **ids, int32_t *n, char *err)
{
    if (x->chat != MKV_CHAT_NONE) return mkv_chat_encode(x->tok, x->chat, msg, ids, n, err);
    return mkv_tokenizer_encode(x->tok, msg, strlen(msg), mkv_tools_add_bos(x->tok), ids, n, err);
}

/* Builds the prompt for one trial: the haystack tokens hay[0 .. H) with the needle sentence
 * inserted after the first sentence end at or after depth * H, then the question; H chosen so
 * that the whole prompt is close to `length` tokens. */
static mkv_status_t build_prompt(const ctx_t *x, const int32_t *hay, int64_t n_hay, int32_t length,
                                 double depth, long secret, int32_t **ids, int32_t *n, char *err)
{
    char needle[128], question[256];
    snprintf(needle, sizeof needle, " The secret number is %ld. Remember it: %ld. ", secret, secret);
    snprintf(question, sizeof question,
             x->chat != MKV_CHAT_NONE
                 ? "\n\nWhat is the secret number mentioned in the text above? Answer with the number only."
                 : "\n\nQuestion: What is the secret number mentioned in the text above?\nAnswer: "
                   "The secret number is");
    int64_t H = length; /* shrunk until the prompt fits */
    char *text = NULL;
    mkv_status_t st = MKV_STATUS_OK;
    for (int attempt = 0; attempt < 8; attempt++) {
        if (H > n_hay) H = n_hay;
        int64_t cut = (int64_t)llround(depth * (double)H);
        /* Move the cut to just after a sentence end, looking at most 64 tokens ahead. */
        for (int64_t k = cut; k < H && k < cut + 64; k++) {
            char piece[256];
            mkv_tokenizer_piece(x->tok, k > 0 ? hay[k - 1] : -1, hay[k], piece, sizeof piece);
            if (strpbrk(piece, ".\n")) {
                cut = k + 1;
                break;
            }
        }
        char *a = NULL, *b = NULL;
        if ((st = mkv_tokenizer_decode(x->tok, hay, (int32_t)cut, 1, &a, err)) != MKV_STATUS_OK ||
            (st = mkv_tokenizer_decode(x->tok, hay + cut, (int32_t)(H - cut), 1, &b, err)) != MKV_STATUS_OK) {
            free(a);
            return st;
        }
        const size_t len = strlen(a) + strlen(needle) + strlen(b) + strlen(question) + 1;
        free(text);
        text = malloc(len);
        if (!text) {
            free(a);
            free(b);
            snprintf(err, MKV_ERR_LEN, "out of memory");
            return MKV_STATUS_OUT_OF_MEMORY;
        }
        snprintf(text, len, "%s%s%s%s", a, needle, b, question);
        free(a);
        free(b);
        free(*ids);
        *ids = NULL;
        if ((st = encode_message(x, text, ids, n, err)) != MKV_STATUS_OK) break;
        if (*n <= length) break;
        H -= (*n - length) + 8; /* re-encoding can merge or split tokens at the joins */
        if (H < 1) {
            snprintf(err, MKV_ERR_LEN, "a prompt of %d tokens cannot hold the question", length);
            st = MKV_STATUS_INVALID_ARGUMENT;
            break;
        }
    }
    free(text);
    if (st == MKV_STATUS_OK && *n > length) {
        snprintf(err, MKV_ERR_LEN, "could not fit the prompt into %d tokens", length);
        st = MKV_STATUS_INVALID_ARGUMENT;
    }
    return st;
}

int mkv_needle_main(int argc, char **argv)
{
    needle_opts_t o = {0};
    o.lengths[0] = 1024, o.lengths[1] = 2048, o.lengths[2] = 4096, o.n_lengths = 3;
    const double dd[5] = {0.0, 0.25, 0.5, 0.75, 1.0};
    memcpy(o.depths, dd, sizeof dd);
    o.n_depths = 5;
    o.trials = 2;
    o.max_new = 24;
    o.seed = 1;
    mkv_policy_opts_default(&o.policy);
    const int p = parse(argc, argv, &o);
    if (p != 0) return p > 0 ? MKV_EXIT_OK : MKV_EXIT_USAGE;

    int rc = MKV_EXIT_FAIL;
    char err[MKV_ERR_LEN];
    ctx_t x = {0};
    mkv_model_t *model = NULL;
    mkv_tokenizer_t *tok = NULL;
    char *hay_text = NULL;
    int32_t *hay = NULL, n_hay = 0, *ids = NULL, n_ids = 0;
    int32_t *out[N_MODES] = {NULL, NULL};
    cell_t *cells = NULL;
    if (mkv_model_load(o.model, &model, err) != MKV_STATUS_OK) {
        mkv_cli_error(CMD, "%s", err);
        return MKV_EXIT_USAGE;
    }
    if (mkv_tokenizer_load(o.model, &tok, err) != MKV_STATUS_OK) {
        mkv_cli_error(CMD, "%s", err);
        rc = MKV_EXIT_USAGE;
        goto done;
    }
    int32_t longest = 0;
    for (int32_t i = 0; i < o.n_lengths; i++) longest = o.lengths[i] > longest ? o.lengths[i] : longest;
    if (longest + o.max_new > model->cfg.max_pos) {
        mkv_cli_error(CMD, "--lengths up to %d plus --max-new %d exceed the model's %d positions",
                      longest, o.max_new, model->cfg.max_pos);
        rc = MKV_EXIT_USAGE;
        goto done;
    }
    size_t hay_len = 0;
    if (!(hay_text = read_haystack(o.haystack, &hay_len))) {
        rc = MKV_EXIT_USAGE;
        goto done;
    }
    if (mkv_tokenizer_encode(tok, hay_text, hay_len, 0, &hay, &n_hay, err) != MKV_STATUS_OK) {
        mkv_cli_error(CMD, "%s: %s", o.haystack, err);
        rc = MKV_EXIT_USAGE;
        goto done;
    }
    if (n_hay < longest) {
        mkv_cli_error(CMD, "the haystack has %d tokens, fewer than --lengths' %d", n_hay, longest);
        rc = MKV_EXIT_USAGE;
        goto done;
    }
    x.model = model;
    x.tok = tok;
    x.chat = o.plain ? MKV_CHAT_NONE : mkv_chat_detect(tok);
    x.end_token = mkv_chat_end_token(tok, x.chat);
    for (int k = 0; k < N_MODES; k++)
        if (!(x.cache[k] = mkv_tools_make_cache(CMD, model, MKV_BACKEND_CPU, k == 0, &o.policy, 1, longest + o.max_new, 1.0)))
            goto done;
    if (mkv_forward_ws_create(model, longest, &x.ws, err) != MKV_STATUS_OK) {
        mkv_cli_error(CMD, "%s", err);
        goto done;
    }
    if (o.threads > 0 && mkv_forward_ws_set_threads(x.ws, o.threads) != MKV_STATUS_OK) {
        mkv_cli_error(CMD, "cannot use %d threads", o.threads);
        goto done;
    }
    x.logits = malloc((size_t)model->cfg.vocab * sizeof(float));
    for (int k = 0; k < N_MODES; k++) out[k] = malloc((size_t)o.max_new * sizeof(int32_t));
    cells = calloc((size_t)o.n_lengths * o.n_depths, sizeof *cells);
    if (!x.logits || !out[0] || !out[1] || !cells) {
        mkv_cli_error(CMD, "out of memory");
        goto done;
    }
    if (!o.quiet)
        fprintf(stderr, "%s: haystack of %d tokens; %d lengths x %d depths x %d trials; template %s\n",
                o.haystack, n_hay, o.n_lengths, o.n_depths, o.trials, mkv_chat_template_name(x.chat));
    uint64_t rng = (uint64_t)o.seed * 0x9E3779B97F4A7C15ull + 1;
    const int32_t runs = o.n_lengths * o.n_depths * o.trials;
    int32_t run = 0;
    for (int32_t li = 0; li < o.n_lengths; li++)
        for (int32_t di = 0; di < o.n_depths; di++)
            for (int32_t t = 0; t < o.trials; t++) {
                cell_t *c = &cells[li * o.n_depths + di];
                rng = rng * 6364136223846793005ull + 1442695040888963407ull;
                const long secret = 10000 + (long)((rng >> 33) % 90000);
                /* Each trial reads a different stretch of the haystack. */
                const int64_t span = n_hay - o.lengths[li];
                const int64_t start = span > 0 ? (int64_t)((rng >> 17) % (uint64_t)(span + 1)) : 0;
                if (build_prompt(&x, hay + start, n_hay - start, o.lengths[li], o.depths[di], secret,
                                 &ids, &n_ids, err) != MKV_STATUS_OK) {
                    mkv_cli_error(CMD, "%s", err);
                    rc = MKV_EXIT_USAGE;
                    goto done;
                }
                int32_t n_out[N_MODES];
                char shown[N_MODES][64] = {"", ""};
                for (int k = 0; k < N_MODES; k++) {
                    double mem = 0.0;
                    if (answer(&x, x.cache[k], ids, n_ids, o.max_new, out[k], &n_out[k], &mem) !=
                        MKV_STATUS_OK) {
                        mkv_cli_error(CMD, "%s", mkv_last_error());
                        goto done;
                    }
                    char *text = NULL;
                    if (mkv_tokenizer_decode(tok, out[k], n_out[k], 1, &text, err) != MKV_STATUS_OK) {
                        mkv_cli_error(CMD, "%s", err);
                        goto done;
                    }
                    c->right[k] += first_number(text) == secret;
                    /* The answer on one line, for the progress line. */
                    snprintf(shown[k], sizeof shown[k], "%s", text);
                    for (char *q = shown[k]; *q; q++) *q = *q == '\n' || *q == '\r' ? ' ' : *q;
                    free(text);
                    if (k == 1) c->memory_ratio_sum += mem;
                }
                c->answers_equal += n_out[0] == n_out[1] &&
                                    !memcmp(out[0], out[1], (size_t)n_out[0] * sizeof(int32_t));
                c->trials++;
                c->prompt_tokens += n_ids;
                run++;
                if (!o.quiet)
                    fprintf(stderr, "[%d/%d] length %d depth %.2f: secret %ld, fp16 \"%s\", mixkv \"%s\"\n",
                            run, runs, n_ids, o.depths[di], secret, shown[0], shown[1]);
            }

    FILE *tf = o.json_path && !strcmp(o.json_path, "-") ? stderr : stdout;
    fprintf(tf, "\nneedle retrieval, right answers of %d trials (fp16 / mixkv):\n\n%-10s", o.trials,
            "length");
    for (int32_t di = 0; di < o.n_depths; di++) fprintf(tf, "   depth %4.2f", o.depths[di]);
    fprintf(tf, "   mixkv memory\n");
    int32_t total[N_MODES] = {0, 0}, all = 0;
    for (int32_t li = 0; li < o.n_lengths; li++) {
        fprintf(tf, "%-10d", o.lengths[li]);
        double mem = 0.0;
        for (int32_t di = 0; di < o.n_depths; di++) {
            const cell_t *c = &cells[li * o.n_depths + di];
            fprintf(tf, "%8d / %-3d", c->right[0], c->right[1]);
            for (int k = 0; k < N_MODES; k++) total[k] += c->right[k];
            all += c->trials;
            mem += c->memory_ratio_sum;
        }
        fprintf(tf, "%13.3f\n", mem / (o.n_depths * o.trials));
    }
    fprintf(tf, "\nright: fp16 %d of %d (%.1f%%), mixkv %d of %d (%.1f%%)\n", total[0], all,
            100.0 * total[0] / all, total[1], all, 100.0 * total[1] / all);
    if (o.json_path) {
        cJSON *root = cJSON_CreateObject();
        cJSON_AddStringToObject(root, "schema", "mixkv-needle");
        cJSON_AddNumberToObject(root, "schema_version", 1);
        cJSON_AddStringToObject(root, "model", o.model);
        cJSON_AddStringToObject(root, "haystack", o.haystack);
        cJSON_AddStringToObject(root, "chat_template", mkv_chat_template_name(x.chat));
        cJSON_AddNumberToObject(root, "trials", o.trials);
        cJSON *pol = cJSON_AddObjectToObject(root, "mixkv_policy");
        cJSON_AddStringToObject(pol, "hi_format", mkv_format_name(o.policy.hi));
        cJSON_AddStringToObject(pol, "lo_format", mkv_format_name(o.policy.lo));
        cJSON_AddNumberToObject(pol, "alpha_h", o.policy.alpha_h);
        cJSON_AddNumberToObject(pol, "alpha_l", o.policy.alpha_l);
        cJSON_AddNumberToObject(pol, "window", o.policy.window);
        mkv_cache_info_t info;
        if (mkv_cache_info(x.cache[1], &info) == MKV_STATUS_OK) {
            cJSON_AddNumberToObject(pol, "hi_key_group", info.config.hi_key_group);
            cJSON_AddNumberToObject(pol, "hi_value_group", info.config.hi_value_group);
            cJSON_AddNumberToObject(pol, "lo_key_group", info.config.lo_key_group);
            cJSON_AddNumberToObject(pol, "lo_value_group", info.config.lo_value_group);
        }
        cJSON *arr = cJSON_AddArrayToObject(root, "cells");
        for (int32_t li = 0; li < o.n_lengths; li++)
            for (int32_t di = 0; di < o.n_depths; di++) {
                const cell_t *c = &cells[li * o.n_depths + di];
                cJSON *j = cJSON_CreateObject();
                cJSON_AddNumberToObject(j, "length", o.lengths[li]);
                cJSON_AddNumberToObject(j, "depth", o.depths[di]);
                cJSON_AddNumberToObject(j, "mean_prompt_tokens", (double)c->prompt_tokens / c->trials);
                cJSON_AddNumberToObject(j, "fp16_right", c->right[0]);
                cJSON_AddNumberToObject(j, "mixkv_right", c->right[1]);
                cJSON_AddNumberToObject(j, "answers_equal", c->answers_equal);
                cJSON_AddNumberToObject(j, "mixkv_memory_ratio_to_fp16", c->memory_ratio_sum / c->trials);
                cJSON_AddItemToArray(arr, j);
            }
        cJSON_AddNumberToObject(root, "fp16_accuracy", (double)total[0] / all);
        cJSON_AddNumberToObject(root, "mixkv_accuracy", (double)total[1] / all);
        const int w = mkv_cli_write_json(CMD, root, o.json_path);
        cJSON_Delete(root);
        if (w < 0) goto done;
    }
    rc = MKV_EXIT_OK;
done:
    free(cells);
    for (int k = 0; k < N_MODES; k++) {
        free(out[k]);
        mkv_cache_destroy(x.cache[k]);
    }
    free(x.logits);
    mkv_forward_ws_free(x.ws);
    free(ids);
    free(hay);
    free(hay_text);
    mkv_tokenizer_free(tok);
    mkv_model_free(model);
    return rc;
}
