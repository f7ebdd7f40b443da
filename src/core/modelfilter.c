/* modelfilter.c — [events] models: glob patterns over model names, and the list in force.
 *
 * Why a module of its own, in core: the same answer ("does this instance hold model M?") is
 * asked by the ZeroMQ receive thread for every message (events layer), by the HTTP loops for
 * every query (http layer), and the configuration checks the patterns (core); one matcher,
 * below all three, keeps them from disagreeing.
 *
 * Matching: the classic single-backtrack glob walk (a `*` remembers where it started; on a
 * mismatch the walk resumes one byte further). Every other token matches exactly one byte,
 * so that one backtrack point is enough and the walk is O(len(pattern) * len(name)) at worst,
 * without recursion. Patterns are at most 255 bytes, names at most the topic's length.
 *
 * Lists in force: an immutable `struct list` published through an atomic pointer (release
 * on store, acquire on load). A replaced list is chained to the new one, not freed, so a
 * reader that loaded it keeps valid memory; all are freed by destroy, when no reader is left.
 */
#include "core/modelfilter.h"

#include <errno.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

struct list {
    char *text;          /* the patterns joined by single spaces ("" when none) */
    const char **pat;    /* into text's bytes (each NUL-terminated in a copy) */
    size_t *len;
    size_t n;
    char *buf;           /* the patterns, NUL-separated */
    struct list *older;  /* the list this one replaced (kept until destroy) */
};

struct kvr_modelfilter {
    _Atomic(struct list *) cur;
    _Atomic uint32_t gen;
};

/* A '[' set at pat[p] (p at '['). Returns the index after its ']', or 0 when unterminated or
 * empty; *in: whether byte c is in the set. */
static size_t set_end(const char *pat, size_t plen, size_t p, unsigned char c, bool *in)
{
    size_t i = p + 1;
    bool neg = false, hit = false, first = true;

    if (i < plen && (pat[i] == '!' || pat[i] == '^')) {
        neg = true;
        i++;
    }
    for (;;) {
        unsigned char lo, hi;
        if (i >= plen)
            return 0;
        if (pat[i] == ']' && !first)
            break;
        first = false;
        if (pat[i] == '\\') {
            if (i + 1 >= plen)
                return 0;
            i++;
        }
        lo = hi = (unsigned char)pat[i++];
        if (i + 1 < plen && pat[i] == '-' && pat[i + 1] != ']') {
            i++;
            if (pat[i] == '\\') {
                if (i + 1 >= plen)
                    return 0;
                i++;
            }
            hi = (unsigned char)pat[i++];
        }
        if (c >= lo && c <= hi)
            hit = true;
    }
    *in = hit != neg;
    return i + 1;
}

bool kvr_modelfilter_glob(const char *pat, size_t plen, const char *s, size_t slen)
{
    size_t p = 0, i = 0, star_p = 0, star_i = 0;
    bool star = false;

    while (i < slen) {
        unsigned char c = (unsigned char)s[i];
        if (p < plen && pat[p] == '*') {
            while (p < plen && pat[p] == '*')
                p++;
            star = true;
            star_p = p;
            star_i = i;
            continue;
        }
        if (p < plen) {
            size_t np = p + 1;
            bool ok;
            if (pat[p] == '?') {
                ok = true;
            } else if (pat[p] == '[' && (np = set_end(pat, plen, p, c, &ok)) != 0) {
                /* ok set by set_end */
            } else {
                /* a literal; `\c` is c, an unterminated '[' is itself */
                np = p + 1;
                if (pat[p] == '\\' && p + 1 < plen)
                    np = p + 2;
                ok = (unsigned char)pat[np - 1] == c;
            }
            if (ok) {
                p = np;
                i++;
                continue;
            }
        }
        if (!star)
            return false;
        p = star_p;
        i = ++star_i;
    }
    while (p < plen && pat[p] == '*')
        p++;
    return p == plen;
}

static bool is_space(char c)
{
    return c == ' ' || c == '\t';
}

/* One pattern: 0 or -EINVAL with err. */
static int check_one(const char *pat, size_t plen, struct kvr_err *err)
{
    if (plen > KVR_MODELFILTER_MAX_PATTERN)
        return kvr_err_set(err, -EINVAL, "pattern '%.40s...' is longer than %d bytes", pat,
                           KVR_MODELFILTER_MAX_PATTERN);
    for (size_t i = 0; i < plen; i++) {
        unsigned char c = (unsigned char)pat[i];
        bool in;
        if (c < 0x20 || c == 0x7f)
            return kvr_err_set(err, -EINVAL, "pattern '%.*s' has a control byte", (int)plen, pat);
        if (c == '\\') {
            if (i + 1 >= plen)
                return kvr_err_set(err, -EINVAL, "pattern '%.*s' ends with '\\'", (int)plen, pat);
            i++;
        } else if (c == '[') {
            size_t e = set_end(pat, plen, i, 0, &in);
            if (e == 0)
                return kvr_err_set(err, -EINVAL,
                                   "pattern '%.*s': '[' set without its ']' (a literal '[' is "
                                   "written '\\[')",
                                   (int)plen, pat);
            i = e - 1;
        }
    }
    return 0;
}

int kvr_modelfilter_check(const char *list, struct kvr_err *err)
{
    size_t n = 0;
    const char *p = list;

    if (list == NULL)
        return 0;
    while (*p != '\0') {
        const char *b;
        int rc;
        while (is_space(*p))
            p++;
        if (*p == '\0')
            break;
        b = p;
        while (*p != '\0' && !is_space(*p))
            p++;
        if (++n > KVR_MODELFILTER_MAX_PATTERNS)
            return kvr_err_set(err, -EINVAL, "more than %d patterns",
                               KVR_MODELFILTER_MAX_PATTERNS);
        if ((rc = check_one(b, (size_t)(p - b), err)) != 0)
            return rc;
    }
    return 0;
}

static void list_free(struct list *l)
{
    while (l != NULL) {
        struct list *o = l->older;
        free(l->text);
        free(l->buf);
        free(l->pat);
        free(l->len);
        free(l);
        l = o;
    }
}

static int list_build(const char *list, struct list **out, struct kvr_err *err)
{
    size_t total = list != NULL ? strlen(list) : 0, n = 0, w = 0, t = 0;
    struct list *l;
    int rc = kvr_modelfilter_check(list, err);

    if (rc != 0)
        return rc;
    l = calloc(1, sizeof(*l));
    if (l == NULL)
        return kvr_err_set(err, -ENOMEM, "out of memory");
    l->text = malloc(total + 1);
    l->buf = malloc(total + 1);
    l->pat = calloc(KVR_MODELFILTER_MAX_PATTERNS, sizeof(*l->pat));
    l->len = calloc(KVR_MODELFILTER_MAX_PATTERNS, sizeof(*l->len));
    if (l->text == NULL || l->buf == NULL || l->pat == NULL || l->len == NULL) {
        list_free(l);
        return kvr_err_set(err, -ENOMEM, "out of memory");
    }
    for (size_t i = 0; i < total;) {
        size_t b;
        while (i < total && is_space(list[i]))
            i++;
        if (i == total)
            break;
        b = i;
        while (i < total && !is_space(list[i]))
            i++;
        l->pat[n] = l->buf + w;
        l->len[n] = i - b;
        memcpy(l->buf + w, list + b, i - b);
        w += i - b;
        l->buf[w++] = '\0';
        if (n > 0)
            l->text[t++] = ' ';
        memcpy(l->text + t, list + b, i - b);
        t += i - b;
        n++;
    }
    l->text[t] = '\0';
    l->n = n;
    *out = l;
    return 0;
}

int kvr_modelfilter_create(const char *list, struct kvr_modelfilter **out, struct kvr_err *err)
{
    struct kvr_modelfilter *f;
    struct list *l;
    int rc;

    *out = NULL;
    if ((rc = list_build(list, &l, err)) != 0)
        return rc;
    f = calloc(1, sizeof(*f));
    if (f == NULL) {
        list_free(l);
        return kvr_err_set(err, -ENOMEM, "out of memory");
    }
    atomic_init(&f->cur, l);
    atomic_init(&f->gen, 0);
    *out = f;
    return 0;
}

int kvr_modelfilter_set(struct kvr_modelfilter *f, const char *list, struct kvr_err *err)
{
    struct list *l;
    int rc = list_build(list, &l, err);

    if (rc != 0)
        return rc;
    l->older = atomic_load_explicit(&f->cur, memory_order_relaxed); /* kept: readers may hold it */
    atomic_store_explicit(&f->cur, l, memory_order_release);
    atomic_fetch_add_explicit(&f->gen, 1, memory_order_release);
    return 0;
}

void kvr_modelfilter_destroy(struct kvr_modelfilter *f)
{
    if (f == NULL)
        return;
    list_free(atomic_load_explicit(&f->cur, memory_order_relaxed));
    free(f);
}

bool kvr_modelfilter_holds(const struct kvr_modelfilter *f, const char *model, size_t len)
{
    const struct list *l;

    if (f == NULL)
        return true;
    l = atomic_load_explicit(&((struct kvr_modelfilter *)f)->cur, memory_order_acquire);
    if (l->n == 0)
        return true;
    for (size_t i = 0; i < l->n; i++)
        if (kvr_modelfilter_glob(l->pat[i], l->len[i], model, len))
            return true;
    return false;
}

bool kvr_modelfilter_active(const struct kvr_modelfilter *f)
{
    return f != NULL &&
           atomic_load_explicit(&((struct kvr_modelfilter *)f)->cur, memory_order_acquire)->n > 0;
}

const char *kvr_modelfilter_text(const struct kvr_modelfilter *f)
{
    if (f == NULL)
        return "";
    return atomic_load_explicit(&((struct kvr_modelfilter *)f)->cur, memory_order_acquire)->text;
}

uint32_t kvr_modelfilter_gen(const struct kvr_modelfilter *f)
{
    if (f == NULL)
        return 0;
    return atomic_load_explicit(&((struct kvr_modelfilter *)f)->gen, memory_order_acquire);
}
