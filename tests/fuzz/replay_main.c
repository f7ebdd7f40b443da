/* replay_main.c — runs a libFuzzer target over a seed corpus without libFuzzer, so gcc-only
 * builds (and `make test`) replay every checked-in input: each file in each directory (or
 * each file argument) is passed to LLVMFuzzerTestOneInput once. Exits non-zero if an
 * argument cannot be read or no input was found. Sanitizer builds turn crashes into reports.
 */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int run_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    uint8_t *buf;
    long n;

    if (f == NULL)
        return -1;
    fseek(f, 0, SEEK_END);
    n = ftell(f);
    fseek(f, 0, SEEK_SET);
    buf = malloc(n > 0 ? (size_t)n : 1);
    if (buf == NULL || (n > 0 && fread(buf, 1, (size_t)n, f) != (size_t)n)) {
        free(buf);
        fclose(f);
        return -1;
    }
    fclose(f);
    LLVMFuzzerTestOneInput(buf, (size_t)n);
    free(buf);
    return 0;
}

int main(int argc, char **argv)
{
    size_t ran = 0;

    for (int i = 1; i < argc; i++) {
        struct stat st;
        if (stat(argv[i], &st) != 0) {
            fprintf(stderr, "replay: cannot stat %s\n", argv[i]);
            return 1;
        }
        if (S_ISDIR(st.st_mode)) {
            DIR *d = opendir(argv[i]);
            struct dirent *e;
            if (d == NULL)
                return 1;
            while ((e = readdir(d)) != NULL) {
                char p[4096];
                if (e->d_name[0] == '.')
                    continue;
                snprintf(p, sizeof(p), "%s/%s", argv[i], e->d_name);
                if (run_file(p) != 0) {
                    fprintf(stderr, "replay: cannot read %s\n", p);
                    closedir(d);
                    return 1;
                }
                ran++;
            }
            closedir(d);
        } else {
            if (run_file(argv[i]) != 0)
                return 1;
            ran++;
        }
    }
    if (ran == 0) {
        fprintf(stderr, "replay: no inputs\n");
        return 1;
    }
    printf("replay: %zu inputs ok\n", ran);
    return 0;
}
