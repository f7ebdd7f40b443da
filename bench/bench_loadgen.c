/* bench_loadgen.c — open-loop HTTP load at a fixed rate, for latency at a given load
 * (wrk2 is not in Debian, and wrk's delay() fires on 1 ms ticks, which sends bursts).
 *
 *   bench_loadgen PORT FILE RATE SECONDS [CONNS] [CTYPE]
 *
 * FILE holds one request body per line (queries.json from http_load.py). Requests
 * "POST /v1/score" are scheduled every 1/RATE seconds (open loop: the schedule never waits for
 * answers) and sent on an idle keep-alive connection (CONNS, default 64). Latency is measured
 * from the scheduled time, not the send time, so a stalled server is not hidden (no
 * coordinated omission); a request that finds no idle connection waits for one and its wait
 * counts. Prints the achieved rate and latency percentiles in microseconds.
 * Single thread; epoll_pwait2 sleeps until the next scheduled send with a nanosecond timeout
 * (no busy polling, so the generator leaves the CPU to the server on small machines).
 */
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

struct conn {
    int fd;
    int busy;
    const char *wbuf;  /* pending request bytes */
    size_t wlen, woff;
    char rbuf[65536];
    size_t rlen;
    double sched;      /* scheduled time of the request in flight */
};

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static int connect_to(int port)
{
    struct sockaddr_in a;
    int fd = socket(AF_INET, SOCK_STREAM, 0), one = 1;

    memset(&a, 0, sizeof(a));
    a.sin_family = AF_INET;
    a.sin_port = htons((uint16_t)port);
    a.sin_addr.s_addr = htonl(0x7f000001);
    if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof(a)) != 0) {
        perror("connect");
        exit(1);
    }
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    return fd;
}

/* Returns 1 when rbuf holds a complete response (then consumes it), 0 if not yet, -1 bad. */
static int take_response(struct conn *c, int *status)
{
    char *hend, *cl;
    size_t hlen, blen;

    c->rbuf[c->rlen < sizeof(c->rbuf) ? c->rlen : sizeof(c->rbuf) - 1] = '\0';
    hend = strstr(c->rbuf, "\r\n\r\n");
    if (hend == NULL)
        return c->rlen >= sizeof(c->rbuf) - 1 ? -1 : 0;
    hlen = (size_t)(hend - c->rbuf) + 4;
    cl = strstr(c->rbuf, "Content-Length: ");
    if (cl == NULL || cl > hend)
        return -1;
    blen = strtoul(cl + 16, NULL, 10);
    if (c->rlen < hlen + blen)
        return 0;
    *status = atoi(c->rbuf + 9);
    memmove(c->rbuf, c->rbuf + hlen + blen, c->rlen - hlen - blen);
    c->rlen -= hlen + blen;
    return 1;
}

int main(int argc, char **argv)
{
    int port, nconns, ep;
    double rate, secs, t0, next, end_sched;
    const char *ctype;
    char *data, **reqs = NULL;
    size_t *lens = NULL, nreq = 0, cap = 0, sent = 0, done = 0, bad = 0, nlat = 0;
    double *lat;
    struct conn *conns;
    size_t *waitq, wq_head = 0, wq_tail = 0; /* scheduled but unsent (no idle connection) */
    double *wq_time;
    FILE *f;
    long fsz;

    if (argc < 5) {
        fprintf(stderr, "usage: %s PORT FILE RATE SECONDS [CONNS] [CTYPE]\n", argv[0]);
        return 2;
    }
    port = atoi(argv[1]);
    rate = atof(argv[3]);
    secs = atof(argv[4]);
    nconns = argc > 5 ? atoi(argv[5]) : 64;
    ctype = argc > 6 ? argv[6] : "application/json";
    f = fopen(argv[2], "rb");
    if (f == NULL || rate <= 0 || secs <= 0 || nconns <= 0)
        return fprintf(stderr, "bad arguments\n"), 2;
    fseek(f, 0, SEEK_END);
    fsz = ftell(f);
    fseek(f, 0, SEEK_SET);
    data = malloc((size_t)fsz + 1);
    if (data == NULL || fread(data, 1, (size_t)fsz, f) != (size_t)fsz)
        return 1;
    data[fsz] = '\0';
    fclose(f);
    for (char *line = strtok(data, "\n"); line; line = strtok(NULL, "\n")) {
        size_t bl = strlen(line), n;
        if (nreq == cap) {
            cap = cap ? cap * 2 : 64;
            reqs = realloc(reqs, cap * sizeof(*reqs));
            lens = realloc(lens, cap * sizeof(*lens));
        }
        reqs[nreq] = malloc(bl + 256);
        n = (size_t)snprintf(reqs[nreq], 256,
                             "POST /v1/score HTTP/1.1\r\nHost: bench\r\nContent-Type: %s\r\n"
                             "Content-Length: %zu\r\n\r\n",
                             ctype, bl);
        memcpy(reqs[nreq] + n, line, bl);
        lens[nreq++] = n + bl;
    }
    if (nreq == 0)
        return fprintf(stderr, "no requests in %s\n", argv[2]), 1;

    lat = malloc(sizeof(double) * (size_t)(rate * secs + 16));
    waitq = malloc(sizeof(size_t) * (size_t)(rate * secs + 16));
    wq_time = malloc(sizeof(double) * (size_t)(rate * secs + 16));
    conns = calloc((size_t)nconns, sizeof(*conns));
    ep = epoll_create1(0);
    for (int i = 0; i < nconns; i++) {
        struct epoll_event ev = {.events = EPOLLIN, .data.u32 = (uint32_t)i};
        conns[i].fd = connect_to(port);
        epoll_ctl(ep, EPOLL_CTL_ADD, conns[i].fd, &ev);
    }

    t0 = now();
    next = t0;
    end_sched = t0 + secs;
    for (;;) {
        double t = now();
        struct epoll_event evs[64];
        int n;
        struct timespec ts;
        double wait;

        /* schedule every send that is due */
        while (next <= t && next < end_sched) {
            waitq[wq_tail] = sent++;
            wq_time[wq_tail++] = next;
            next += 1.0 / rate;
        }
        /* hand due requests to idle connections */
        for (int i = 0; i < nconns && wq_head < wq_tail; i++) {
            struct conn *c = &conns[i];
            ssize_t w;
            if (c->busy)
                continue;
            c->busy = 1;
            c->sched = wq_time[wq_head];
            c->wbuf = reqs[waitq[wq_head] % nreq];
            c->wlen = lens[waitq[wq_head] % nreq];
            c->woff = 0;
            wq_head++;
            w = write(c->fd, c->wbuf, c->wlen);
            if (w > 0)
                c->woff = (size_t)w;
            if (c->woff < c->wlen) {
                struct epoll_event ev = {.events = EPOLLIN | EPOLLOUT, .data.u32 = (uint32_t)i};
                epoll_ctl(ep, EPOLL_CTL_MOD, c->fd, &ev);
            }
        }
        if (next >= end_sched && wq_head == wq_tail && done + bad == sent)
            break;
        if (t > end_sched + 10.0) {
            fprintf(stderr, "loadgen: %zu answers missing after 10 s\n", sent - done - bad);
            break;
        }
        wait = next >= end_sched ? 0.01 : next - now();
        if (wait < 0)
            wait = 0;
        ts.tv_sec = (time_t)wait;
        ts.tv_nsec = (long)((wait - (double)ts.tv_sec) * 1e9);
        n = epoll_pwait2(ep, evs, 64, &ts, NULL);
        for (int k = 0; k < n; k++) {
            struct conn *c = &conns[evs[k].data.u32];
            if (evs[k].events & EPOLLOUT) {
                ssize_t w = write(c->fd, c->wbuf + c->woff, c->wlen - c->woff);
                if (w > 0)
                    c->woff += (size_t)w;
                if (c->woff == c->wlen) {
                    struct epoll_event ev = {.events = EPOLLIN, .data.u32 = evs[k].data.u32};
                    epoll_ctl(ep, EPOLL_CTL_MOD, c->fd, &ev);
                }
            }
            if (evs[k].events & (EPOLLIN | EPOLLHUP | EPOLLERR)) {
                ssize_t r = read(c->fd, c->rbuf + c->rlen, sizeof(c->rbuf) - 1 - c->rlen);
                int status, got;
                if (r <= 0) {
                    fprintf(stderr, "loadgen: connection closed by the server\n");
                    return 1;
                }
                c->rlen += (size_t)r;
                while ((got = take_response(c, &status)) == 1) {
                    double tt = now();
                    if (status == 200)
                        lat[nlat++] = (tt - c->sched) * 1e6, done++;
                    else
                        bad++;
                    c->busy = 0;
                }
                if (got < 0) {
                    fprintf(stderr, "loadgen: bad response\n");
                    return 1;
                }
            }
        }
    }
    {
        double elapsed = now() - t0;
        qsort(lat, nlat, sizeof(double), cmp_d);
#define PCT(q) (nlat ? lat[(size_t)((double)(nlat - 1) * (q))] : 0.0)
        printf("loadgen: offered %.0f req/s for %.0f s over %d connections: %zu answered "
               "(%.0f req/s), non-200 %zu\n",
               rate, secs, nconns, done, (double)done / elapsed, bad);
        printf("LAT p50_us=%.0f p90_us=%.0f p99_us=%.0f p999_us=%.0f max_us=%.0f\n", PCT(0.50),
               PCT(0.90), PCT(0.99), PCT(0.999), nlat ? lat[nlat - 1] : 0.0);
#undef PCT
    }
    return bad != 0;
}
