/* conf_int.h — private to conf*.c: the value parsers of conf_value.c that conf.c's setters
 * use besides the public kvr_conf_parse_* of conf.h, the [model] calls of conf_model.c, and
 * the directive table of conf.c that conf_reload.c walks (its types and FIELD accessors).
 */
#ifndef KVR_CONF_INT_H
#define KVR_CONF_INT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Parses an unsigned decimal integer prefix of s: the count of digits consumed (value in
 * *out), -1 when s does not start with a digit, -ERANGE past UINT64_MAX. */
int kvr_conf_parse_digits(const char *s, uint64_t *out);
/* on/off, true/false, yes/no, 1/0 (any case) into *out: 0, or -EINVAL (*out unchanged). */
int kvr_conf_parse_bool(const char *s, bool *out);
/* 0 when ep is a valid ZMQ endpoint (tcp://HOST:PORT, ipc://PATH, inproc://NAME), else
 * -EINVAL. for_bind: the tcp host may be '*' and the port '*' or 0 (ephemeral). */
int kvr_conf_check_endpoint(const char *ep, bool for_bind);

/* The directive table (conf.c): one entry per directive, in file order. conf.c parses and
 * defaults through it; conf_reload.c compares and copies the reloadable fields through it.
 * const: any thread may read it. */
enum dtype {
    T_LEVEL,     /* int: enum kvr_log_level */
    T_FORMAT,    /* int: enum kvr_log_format */
    T_DURATION,  /* int64_t ms */
    T_SIZE,      /* int64_t bytes */
    T_U32,       /* uint32_t plain integer */
    T_I64,       /* int64_t plain integer */
    T_STRING,    /* char * */
    T_BIND,      /* char **bind + nbind (endpoint list) */
    T_CONNECT,   /* struct kvr_conf_connect * + nconnect */
    T_HOSTPORT,  /* char * "IP:PORT" */
    T_WEIGHT,    /* weight.<tier>: weights[] */
    T_DOUBLE,    /* double */
    T_CIDR,      /* struct kvr_cidr * + count (repeatable address ranges) */
    T_BOOL,      /* bool: on/off, true/false, yes/no, 1/0 */
};

enum {
    F_REPEATABLE = 1u << 0,
    F_RELOADABLE = 1u << 1,
    F_EMPTY_OK = 1u << 2,
};

struct directive {
    const char *section;
    const char *name; /* "weight.*" matches any weight.<tier> */
    enum dtype type;
    const char *def;  /* default as config text; NULL = unset */
    double min, max;  /* inclusive range for numeric types */
    unsigned flags;
    size_t off;       /* offset of the field in struct kvr_conf */
};

/* Units of the table's defaults and ranges, and of the messages that print them. */
#define MS_S 1000.0
#define MS_M 60000.0
#define MS_H 3600000.0
#define KiB 1024.0
#define MiB (1024.0 * 1024.0)
#define GiB (1024.0 * 1024.0 * 1024.0)

extern const struct directive kvr_conf_directives[]; /* conf_table.c */
#define KVR_CONF_MAX_DIRECTIVES 256 /* the table's size at most (checked there) */
extern const size_t kvr_conf_ndirectives; /* entries in kvr_conf_directives[] */

/* The field of struct kvr_conf (c) that directive d describes, as a T * (const T *). */
#define FIELD(c, d, T) ((T *)(void *)((char *)(c) + (d)->off))
#define CFIELD(c, d, T) ((const T *)(const void *)((const char *)(c) + (d)->off))

/* [model "NAME"] sections (conf_model.c). hdr[0..n) is the header between '[' and ']',
 * starting with "model": the name goes to name[cap]; -EINVAL with a message otherwise. */
struct kvr_conf;
int kvr_conf_model_header(const char *hdr, size_t n, char *name, size_t cap, char *msg,
                          size_t msgcap);
/* Appends a model (duplicate names: -EINVAL); its keys then go to kvr_conf_model_key. */
int kvr_conf_model_add(struct kvr_conf *c, const char *name, int line, char *msg, size_t msgcap);
int kvr_conf_model_key(struct kvr_conf *c, const char *key, const char *value, int line,
                       char *msg, size_t msgcap);
void kvr_conf_models_free(struct kvr_conf *c);
/* Copies fresh's model list onto live; calls changed() for each model added, removed or
 * changed; returns their number, or -ENOMEM (live unchanged). */
int kvr_conf_models_reload(struct kvr_conf *live, const struct kvr_conf *fresh,
                           void (*changed)(void *arg, const char *name), void *arg);

#endif
