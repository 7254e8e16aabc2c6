/*
 * The scheduler's configuration as a rank reads it, once, in coh_init on the
 * caller's thread (never on the coordinator's loop): the parameters from
 * their defaults, COHORT_SCHED ("name=value,...", the config's sched field)
 * and COHORT_SCHED_<NAME> each, checked on every rank so that a bad one
 * fails coh_init everywhere alike; and on the coordinator's rank the
 * warm-start trace (COHORT_SCHED_TRACE).
 */
#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "reactor/rx_sync.h"

static int load_params(const coh_config_t *cfg, int world, sc_params_t *p)
{
    sc_params_default(p);
    const char *list = cfg->sched;
    if (list && *list) {
        char *copy = coh_strdup(list), *save = NULL;
        if (!copy) return bs_fail(COH_ENOMEM, "out of memory");
        for (char *kv = strtok_r(copy, ",", &save); kv; kv = strtok_r(NULL, ",", &save)) {
            char *eq = strchr(kv, '=');
            int st = 0;
            if (!eq) {
                st = bs_fail(COH_EINVAL, "COHORT_SCHED: \"%s\" is not name=value", kv);
            } else {
                *eq = 0;
                if (sc_params_set(p, kv, eq + 1) < 0)
                    st = bs_fail(COH_EINVAL, "COHORT_SCHED: bad parameter %s=%s", kv, eq + 1);
            }
            if (st < 0) {
                coh_free(copy);
                return st;
            }
        }
        coh_free(copy);
    }
    int n;
    const sc_param_info_t *info = sc_params_info(&n);
    for (int i = 0; i < n; i++) {
        char var[96] = "COHORT_SCHED_";
        size_t l = strlen(var);
        for (const char *q = info[i].name; *q && l < sizeof(var) - 1; q++)
            var[l++] = *q == '-' ? '_' : (char)toupper((unsigned char)*q);
        var[l] = 0;
        const char *v = getenv(var);
        if (v && *v && sc_params_set(p, info[i].name, v) < 0)
            return bs_fail(COH_EINVAL, "%s=\"%s\": not a valid value (%s)", var, v, info[i].range);
    }
    /* A group of one synchronises with nobody: below 7 ranks 0.3n rounds to
     * 1 or 2, so the live default keeps groups of at least two. */
    if (p->p == 0 && world >= 2) {
        int pp = (int)lround(p->p_frac * world);
        p->p = pp < 2 ? 2 : pp;
    }
    if (p->p > world) p->p = world;
    if (sc_params_validate(p, world) < 0)
        return bs_fail(COH_EINVAL, "scheduler parameters out of range for %d ranks", world);
    return 0;
}

/* Warm start: a CSV "worker,bandwidth_gbps,compute_s" as cohort-sim replay
 * reads it: each worker's compute samples become its CDF, its bandwidth the
 * first estimate. */
static int load_trace(const char *path, rx_sched_cfg_t *c)
{
    FILE *f = fopen(path, "r");
    if (!f) return bs_fail(COH_EINVAL, "COHORT_SCHED_TRACE: cannot open %s", path);
    int n = c->world, *cap = coh_calloc((size_t)n, sizeof(int));
    c->trace_bw = coh_calloc((size_t)n, sizeof(double));
    c->trace_samples = coh_calloc((size_t)n, sizeof(double *));
    c->trace_n = coh_calloc((size_t)n, sizeof(int));
    int st = 0;
    if (!cap || !c->trace_bw || !c->trace_samples || !c->trace_n)
        st = bs_fail(COH_ENOMEM, "COHORT_SCHED_TRACE: out of memory");
    char line[256];
    while (st == 0 && fgets(line, sizeof(line), f)) {
        int w;
        double bw, cs;
        if (sscanf(line, "%d,%lf,%lf", &w, &bw, &cs) != 3 || w < 0 || w >= n) continue;
        if (bw > 0 && isfinite(bw)) c->trace_bw[w] = bw;
        if (!(cs >= 0) || !isfinite(cs)) continue;
        if (c->trace_n[w] == cap[w]) {
            int nc = cap[w] ? 2 * cap[w] : 64;
            double *ns = coh_reallocn(c->trace_samples[w], (size_t)nc, sizeof(double));
            if (!ns) {
                st = bs_fail(COH_ENOMEM, "COHORT_SCHED_TRACE: out of memory");
                break;
            }
            c->trace_samples[w] = ns;
            cap[w] = nc;
        }
        c->trace_samples[w][c->trace_n[w]++] = cs;
    }
    fclose(f);
    coh_free(cap);
    return st;
}

int rx_sched_cfg_load(const coh_config_t *cfg, int world, bool coordinator, rx_sched_cfg_t *out)
{
    memset(out, 0, sizeof(*out));
    out->world = world;
    int st = load_params(cfg, world, &out->params);
    const char *trace = getenv("COHORT_SCHED_TRACE");
    if (st == 0 && coordinator && trace && *trace) st = load_trace(trace, out);
    if (st < 0) rx_sched_cfg_fini(out);
    return st;
}

void rx_sched_cfg_fini(rx_sched_cfg_t *c)
{
    for (int w = 0; c->trace_samples && w < c->world; w++) coh_free(c->trace_samples[w]);
    coh_free(c->trace_samples);
    coh_free(c->trace_bw);
    coh_free(c->trace_n);
    c->trace_samples = NULL;
    c->trace_bw = NULL;
    c->trace_n = NULL;
}
