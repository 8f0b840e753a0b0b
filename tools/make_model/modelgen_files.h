/* modelgen_files.h: the file side of tandem_modelgen: paths, the output
 * directory, and copies of a source model's tokenizer files. Private to
 * tools/make_model. Errors: 0 or a code from error.h with err set.
 */
#ifndef TANDEM_MODELGEN_FILES_H
#define TANDEM_MODELGEN_FILES_H

#define MODELGEN_PATH_MAX 4096

/* buf (MODELGEN_PATH_MAX bytes) = dir/name; ERR_INVALID_ARG when too long. */
int mg_join_path(char *buf, const char *dir, const char *name, char *err);
/* mkdir -p dir (mode 0755). */
int mg_mkdir_parents(const char *dir, char *err);
/* Creates dir or checks that it is empty (unless force: then the files a
 * files a previous model may have left and this one might not overwrite
 * are removed first). */
int mg_prepare_out_dir(const char *dir, int force, char *err);
/* Copies the file src to dst. */
int mg_copy_file(const char *src, const char *dst, char *err);
/* Copies tokenizer.json and tokenizer_config.json from src_dir into dir;
 * a missing one is an error only when required. */
int mg_copy_tokenizer(const char *src_dir, const char *dir, int required, char *err);

#endif
