/* jtok.h — a small strict JSON cursor for request bodies, with a fast path for the one big
 * thing in them: an array of token ids (unsigned 32-bit integers).
 *
 * The cursor walks a mutable buffer the caller owns (a request body). Strings are decoded in
 * place (the decoded form is never longer than the escaped one) and NUL-terminated, so a
 * decoded string points into the buffer and needs no allocation. Everything is RFC 8259
 * strict: no comments, no trailing commas, no leading zeros or '+', UTF-8 validated,
 * surrogate escapes paired, and raw control characters (bytes below 0x20) rejected.
 *
 * U+0000: the escape "\u0000" is valid JSON and decodes to a 0 byte inside the string (vLLM
 * takes such prompts and message contents and tokenizes the character like any other). So a
 * decoded string is its pointer AND its length: it may hold NUL bytes before the terminator,
 * and strlen() would cut it short. A caller that needs a C string (a name, a key into a
 * table) checks memchr(s, 0, len) and refuses the value with an error naming the field.
 * Object keys decode the same way (a key holding NUL just matches no known name).
 *
 * kvr_jtok_u32_array() parses "[1, 2, 3]" eight bytes at a time (SWAR digit conversion) with
 * full validation: negatives, fractions, exponents, leading zeros and values >= 2^32 are
 * errors (-EINVAL); more than `cap` elements is -E2BIG. It never reads past `end`.
 *
 * Errors: every function returns 0 (or a documented positive value) or a negative errno,
 * and records the first error in the cursor (code, static message, byte offset, element
 * index) so the caller can build a 400 message. Pure functions of the buffer; any thread.
 */
#ifndef KVR_JTOK_H
#define KVR_JTOK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define KVR_JTOK_MAX_DEPTH 64 /* nesting accepted by kvr_jtok_skip() */

struct kvr_jtok {
    char *p;           /* cursor */
    char *end;
    char *base;        /* start of the buffer (error offsets) */
    int code;          /* first error: 0, -EINVAL or -E2BIG */
    const char *msg;   /* static text of the first error */
    size_t err_off;    /* byte offset of the first error */
    size_t err_index;  /* element index for kvr_jtok_u32_array errors, else SIZE_MAX */
};

void kvr_jtok_init(struct kvr_jtok *j, char *buf, size_t len);

/* Skips JSON whitespace; returns the next byte, or -1 at the end of the buffer. */
int kvr_jtok_peek(struct kvr_jtok *j);
/* Consumes the byte c after optional whitespace; -EINVAL (with msg) when it is not there. */
int kvr_jtok_expect(struct kvr_jtok *j, char c, const char *msg);
/* 0 when only whitespace remains; else -EINVAL "trailing data". */
int kvr_jtok_finish(struct kvr_jtok *j);

/* A string at the cursor (after optional whitespace), decoded in place and NUL-terminated.
 * *s points into the buffer; *len excludes the terminator, and bytes before it may be 0 (an
 * escaped U+0000): use *len, not strlen. */
int kvr_jtok_string(struct kvr_jtok *j, char **s, size_t *len);
/* 1 and consumes "null" when the next value is null, 0 when it is something else. */
int kvr_jtok_null(struct kvr_jtok *j);
/* A non-negative integer (no fraction, exponent or leading zero) at the cursor into *v: 0,
 * or -EINVAL. */
int kvr_jtok_u64(struct kvr_jtok *j, uint64_t *v);
/* A JSON number at the cursor, validated: *s and *len its text (not NUL-terminated). */
int kvr_jtok_number(struct kvr_jtok *j, char **s, size_t *len);
/* true or false at the cursor into *v: 0, or -EINVAL. */
int kvr_jtok_bool(struct kvr_jtok *j, bool *v);
/* Validates and skips any value; nesting deeper than KVR_JTOK_MAX_DEPTH is -EINVAL. Strings
 * are validated but not rewritten. */
int kvr_jtok_skip(struct kvr_jtok *j);

/* Object iteration: call with *state = 0 at a '{' (after optional whitespace). Returns 1 with
 * the decoded key (cursor after the ':', ready for the value), 0 after the closing '}', or a
 * negative errno. The caller parses or skips the value between calls. */
int kvr_jtok_object_next(struct kvr_jtok *j, int *state, char **key, size_t *keylen);
/* Array iteration, same protocol: 1 when an element follows (cursor at it), 0 after ']'. */
int kvr_jtok_array_next(struct kvr_jtok *j, int *state);

/* Array of unsigned 32-bit integers at the cursor (after optional whitespace) into
 * out[0..cap); *n = the count. -EINVAL for anything but such an array, -E2BIG when it has
 * more than cap elements. */
int kvr_jtok_u32_array(struct kvr_jtok *j, uint32_t *out, size_t cap, size_t *n);

/* Tests and benchmarks: limits the integer-array paths to 0 = portable per-token only,
 * 1 = + SSE2 blocks, 2 = + AVX2 blocks, 3 = + AVX-512 (BW, VBMI, VBMI2) blocks (x86-64; never
 * above what the CPU has); -1 = the best available (the default). Returns the level in
 * effect. Not for concurrent use. */
int kvr_jtok_force_isa(int level);

/* Formats the recorded error as "MSG at byte N" or "MSG (element I, byte N)". */
size_t kvr_jtok_errstr(const struct kvr_jtok *j, char *dst, size_t cap);

/* JSON string escaping for output: appends the quoted, escaped form of s[0..len) to dst
 * (which has room for at least 6 * len + 2 bytes); returns the bytes written. Bytes >= 0x80
 * are copied as they are (callers hand UTF-8 or names from the index). */
size_t kvr_jtok_escape(char *dst, const char *s, size_t len);

#endif
