/*
** dispatch.c - every luv callback runs in its own context.
**
** luv calls every Lua callback through ctx->cb_pcall; the library's
** replacement (ah_luv_cb_pcall) runs each one in its context: a record's
** (see register.c), or the root context (asyncId 0, empty frame) for a callback
** nobody tracked, and restores the caller's context afterwards, also when
** the callback raised (luv's own handler has printed the error, with its
** traceback, by then).  Three paths:
**  - root: a plain callback arriving while the thread's context is empty
**    (uv.run at top level): only the ids are switched, no Lua call;
**  - inline (the main thread, where luv runs callbacks): the record's frame
**    and resource are switched in C, luv calls the user's function itself
**    (no extra frame in tracebacks) and nothing allocates once the context
**    is switched; hook events go through one protected call each;
**  - slow: anything else (other threads, a resource made lazily), through
**    protected enter/leave closures that do their allocations first.
** ah_luv_cb_pcall recognises the callback once (a record, a quick record
** or a plain function) and takes the first path that fits: dispatch_root,
** then one inline path per kind (run_record, inlined there: one prologue
** per callback; run_quick and run_plain, functions of their own: short
** runs of code), else run_slow.
** A record's __call does the same when luv calls it without our cb_pcall in
** front (after uninstall()).
*/
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "private.h"

/* ------------------------------------------------------------------- */
/* native stack of entered records (push and pop: private.h)            */

/* `after` for every record entered above depth (an error unwound them);
** 1 with the first error of their dispatches pushed */
static int cb_unwind(lua_State *L, ah_luv *lv, size_t depth) {
  ah_state *st = lv->st;
  int err = 0;
  while (lv->cb_n > depth) {
    err = ah_keep_first(L, err, ah_emit_id(L, st, AH_AFTER, lv->cb[lv->cb_n - 1]));
    cb_pop(lv);
    st->active--;
  }
  return err;
}

/* raises its last argument: what luv calls in a callback's place to
** handle an error of the callback's hooks as the callback's own */
static int raise_last(lua_State *L) {
  return lua_error(L);
}

/* An error of a callback's hook dispatch (on top; not the hook's own) is
** the callback's: luv handles it as it handles a callback's error (prints
** it, and exits unless its flags say otherwise).  Pops it. */
static AH_COLD void luv_report(lua_State *L, ah_luv *lv, int flags) {
  lua_pushcfunction(L, raise_last);
  lua_insert(L, -2);
  lv->orig(L, 1, 0, flags);
}

/* ------------------------------------------------------------------- */
/* the record's __call (luv calls it without our cb_pcall in front)      */

/* what entering a callback's context pushes on the slow paths (the
** record's __call, luv_enter): the saved context and the entered one, the
** callback, a resource made, its before's dispatch, an error */
#define ENTER_STACK (AH_EMIT_STACK + 16)

/* enter the record's context, call its callback with luv's arguments,
** restore; called protected so that the context is restored on error */
int ah_luv_rec_call(lua_State *L) {
  ah_state *st = ah_st(L);
  ah_luv *lv;
  ah_rec *r = NULL;
  int n = lua_gettop(L), s, i, status, oneshot, pov;
  lua_Integer id, pid, ptrig;
  luaL_checkstack(L, n + ENTER_STACK, "async_hooks");
  /* self: a record of this state (the metatable is reachable from Lua) */
  lv = ah_luv_push(L);
  r = ah_luv_record(L, lv, 1);
  lua_pop(L, 1);
  if (!r) return luaL_error(L, "bad self (async_hooks luv record expected)");
  s = ah_slot_of(L, st);
  id = r->id;
  pid = st->slots[s].id;
  ptrig = st->slots[s].trigger;
  oneshot = r->flags & REC_ONESHOT;
  if (!(r->flags & REC_RES) && st->res_on) ah_luv_materialize(L, r, 1);
  ah_reserve(L, s);
  ah_frame_sync(L, st, s);
  lua_rawgeti(L, AH_UV_R, s); /* n+1: previous resource */
  lua_rawgeti(L, AH_UV_F, s); /* n+2: previous frame */
  ah_luv_push_resource(L, r, 1); /* n+3 */
  lua_getiuservalue(L, 1, RV_FRAME); /* n+4 */
  if (!cb_push(lv, id)) return luaL_error(L, "not enough memory");
  st->slots[s].id = id;
  st->slots[s].trigger = r->trigger;
  ah_set_resource(L, s, n + 3);
  if (!(r->flags & REC_RES)) { /* made if asked for: ah_luv_resource */
    lua_pushvalue(L, 1);
    lua_rawseti(L, AH_UV_R, s);
  }
  ah_set_frame(L, s, n + 4);
  pov = st->ov.slot;
  if (pov == s) st->ov.slot = 0; /* in a coroutine's event (see ah.h) */
  st->active++;
  /* an error of the before dispatch is the callback's (which does not
  ** run), raised once the context is restored */
  status = ah_emit_id(L, st, AH_BEFORE, id);
  if (ah_likely(!status)) {
    lua_getiuservalue(L, 1, RV_CB);
    for (i = 2; i <= n; i++) lua_pushvalue(L, i);
    status = lua_pcall(L, n - 1, 0, 0) != LUA_OK;
  }
  status = ah_keep_first(L, status, cb_unwind(L, lv, lv->cb_n - 1));
  s = ah_slot_of(L, st);
  st->slots[s].id = pid;
  st->slots[s].trigger = ptrig;
  ah_set_resource(L, s, n + 1);
  ah_set_frame(L, s, n + 2);
  if (pov == s) st->ov.slot = pov;
  if (oneshot && st->nhooks[AH_DESTROY]) ah_queue_destroy(st, id);
  if (ah_flush_due(st)) status = ah_keep_first(L, status, ah_flush_status(L, st));
  if (status) return lua_error(L); /* the error object is on top */
  return 0;
}

/* ------------------------------------------------------------------- */
/* what every path in the loop shares                                  */

/* luv's pushes per callback (at most LUA_MINSTACK) + an inline path's (32) */
#define AH_RUN_STACK (LUA_MINSTACK + 32)
/* ah_flush_maybe's work, where luv's cb_pcall must not raise: the Lua
** step (on_destroy_hooks' callback) runs protected through LV_FLUSH, a
** closure of the frame that runs the loop (RUN_LV); the rest allocates
** nothing (ah_flush's stack check fits in what ah_luv_run reserved).
** Returns 1 with the first error of the destroys' dispatches pushed. */
static AH_NOINLINE int flush_in_run(lua_State *L, ah_luv *lv, ah_state *st) {
  int err;
  if (!st->notify_pending) return ah_flush_status(L, st);
  if (lua_touserdata(L, RUN_LV) == lv) /* (else: damaged, see ah_luv_run) */
    lua_getiuservalue(L, RUN_LV, LV_FLUSH);
  else
    lua_pushnil(L);
  if (lua_pcall(L, 0, 0, 0) != LUA_OK) { /* out of memory: */
    lua_pop(L, 1);
    st->notify_pending = 0; /* the destroys without the Lua step, */
    err = ah_flush_status(L, st);
    st->notify_pending = 1; /* which is retried at the next flush */
    return err;
  }
  return ah_flush_status(L, st);
}

/* F[s] = the frame at idx, not anchored (the inline path holds it on the
** stack meanwhile); counted like every frame write.  The dispatch runs in
** the frame of the library's uv.run, which checked its upvalues (an error
** raised here would cross luv's C code): AH_UVI_*, unchecked */
static void frame_write(lua_State *L, ah_state *st, int s, int idx) {
  lua_pushvalue(L, idx);
  lua_rawseti(L, AH_UVI_F, s);
  st->fgen++;
}

/* what the anchored switches of a callback's context write (anchors.c)
** is there: tables where it needs tables (it raises otherwise, and the
** dispatch must not raise); else the switch is left out */
static AH_NOINLINE int switch_ok(lua_State *L) {
  static const int keys[] = {AUX_PEND, AUX_TR, AUX_FRAME_PMT, AUX_FRAME_MT};
  int i, ok = ah_tables_ok(L, AH_TALL) && ah_st_try(L) != NULL;
  for (i = 0; ok && i < (int)(sizeof keys / sizeof keys[0]); i++) {
    ok = lua_rawgeti(L, AH_UVI_AUX, keys[i]) == LUA_TTABLE;
    lua_pop(L, 1);
  }
  return ok;
}

/* ------------------------------------------------------------------- */
/* the slow path                                                         */

/* the ah_luv of the enter/leave closure running (its E_LV, reachable
** from Lua: checked) */
static ah_luv *e_lv(lua_State *L, ah_state *st) {
  ah_luv *lv = ah_luv_at(L, E_LV);
  if (lv == NULL || lv->st != st)
    luaL_error(L, "async_hooks: internal state damaged (upvalue %d)", AH_NUP + 1);
  return lv;
}

/* The slow path's enter(X): save the current thread's context and enter
** the callback's: the record's (its before is emitted here), or else the
** root context.  Returns previous resource, frame, id, trigger, depth of
** lv->cb, the function luv must call, and nil, or else (the before
** dispatch failed: the error is the callback's, which does not run)
** raise_last and the error.  Everything that can fail comes first: nothing
** has changed if it does. */
static int luv_enter(lua_State *L) {
  ah_state *st = ah_st(L);
  ah_luv *lv = e_lv(L, st);
  /* a quick record runs as its record (luv then calls the callback itself,
  ** which keeps its traceback whole) */
  ah_rec *r = lua_tocfunction(L, 1) == ah_luv_q_fn ? ah_luv_q_record(L, lv, 1)
                                                   : ah_luv_record(L, lv, 1);
  int s = ah_slot_of(L, st);
  luaL_checkstack(L, ENTER_STACK, "async_hooks");
  lua_settop(L, 1);
  ah_reserve(L, s);
  if (r && !(r->flags & REC_RES) && st->res_on) ah_luv_materialize(L, r, 1);
  /* a callback that luv calls from inside an inline one (luv's own
  ** uv.run, or a function of luv's that calls back at once): the inline
  ** one's frame, written first */
  ah_frame_sync(L, st, s);
  lua_rawgeti(L, AH_UV_R, s);
  lua_rawgeti(L, AH_UV_F, s);
  lua_pushinteger(L, st->slots[s].id);
  lua_pushinteger(L, st->slots[s].trigger);
  lua_pushinteger(L, (lua_Integer)lv->cb_n);
  if (r) {
    ah_luv_push_resource(L, r, 1);        /* 7 */
    lua_getiuservalue(L, 1, RV_FRAME); /* 8 */
    lua_getiuservalue(L, 1, RV_CB);    /* 9 */
    if (!cb_push(lv, r->id)) return luaL_error(L, "not enough memory");
    /* switch */
    st->active += 2;
    st->slots[s].id = r->id;
    st->slots[s].trigger = r->trigger;
    ah_set_resource(L, s, 7);
    if (!(r->flags & REC_RES)) { /* made if asked for: ah_luv_resource */
      lua_pushvalue(L, 1);
      lua_rawseti(L, AH_UV_R, s);
    }
    ah_set_frame(L, s, 8);
    lua_replace(L, 7);
    lua_settop(L, 7);
    if (ah_unlikely(ah_emit_id(L, st, AH_BEFORE, r->id))) {
      lua_pushcfunction(L, raise_last);
      lua_replace(L, 7);
      return 7;
    }
    lua_pushnil(L);
  } else {
    lua_pushvalue(L, 1);
    lua_pushboolean(L, 0);
    lua_rawgeti(L, AH_UV_AUX, AUX_EMPTY);
    st->active++;
    st->slots[s].id = 0;
    st->slots[s].trigger = 0;
    ah_set_resource(L, s, -2);
    ah_set_frame(L, s, -1);
    lua_pop(L, 2);
    lua_pushnil(L); /* no error */
  }
  return 7;
}

/* leave(res, frame, id, trigger, depth, X): `after` for the callback's
** record and any that an error unwound, its destroy when one-shot,
** restore, flush.  Allocates nothing; the first error of the dispatches
** is raised once all is done. */
static int luv_leave(lua_State *L) {
  ah_state *st = ah_st(L);
  ah_luv *lv = e_lv(L, st);
  ah_rec *r = ah_luv_record(L, lv, 6);
  int s, err;
  lua_settop(L, 6);
  err = cb_unwind(L, lv, (size_t)lua_tointeger(L, 5));
  if (r && (r->flags & REC_ONESHOT) && st->nhooks[AH_DESTROY])
    ah_queue_destroy(st, r->id);
  s = ah_slot_of(L, st);
  st->slots[s].id = lua_tointeger(L, 3);
  st->slots[s].trigger = lua_tointeger(L, 4);
  ah_set_resource(L, s, 1);
  if (lua_isnil(L, 2)) {
    lua_rawgeti(L, AH_UV_AUX, AUX_EMPTY);
    lua_replace(L, 2);
  }
  ah_set_frame(L, s, 2);
  st->active--;
  if (ah_flush_due(st)) err = ah_keep_first(L, err, ah_flush_status(L, st));
  if (err) return lua_error(L);
  return 0;
}

/* the Lua step of a flush (flush_in_run delivers the destroys) */
static int luv_flush(lua_State *L) {
  ah_state *st = ah_st(L);
  if (st->notify_pending) ah_notify_destroy_hooks(L, st);
  return 0;
}

#define NSAVED 7 /* lv res frame id trigger depth X */

/* Anything the inline path does not do: through the enter/leave closures,
** called protected.  Stack: [X args lv]. */
static int dispatch_slow(lua_State *L, ah_luv *lv, int nargs, int nresults,
                         int flags) {
  int base = lua_gettop(L) - nargs - 1, ret, top;
  if (!lua_checkstack(L, NSAVED + 5)) { /* no memory: run it bare */
    lua_pop(L, 1);
    return lv->orig(L, nargs, nresults, flags);
  }
  lua_getiuservalue(L, -1, LV_ENTER);
  lua_pushvalue(L, base);
  if (lua_pcall(L, 1, 7, 0) != LUA_OK) { /* out of memory, nothing entered */
    lua_settop(L, base + nargs);         /* luv calls the record, */
    return lv->orig(L, nargs, nresults, flags); /* whose __call copes */
  }
  if (ah_unlikely(!lua_isnil(L, -1))) { /* the before dispatch's error: */
    lua_insert(L, base + nargs + 1); /* after the arguments of raise_last */
    nargs++;
  } else {
    lua_pop(L, 1);
  }
  /* [X args lv res frame id trig depth fn] -> [fn args lv ... depth X] */
  lua_pushvalue(L, base);
  lua_copy(L, -2, base);
  lua_remove(L, -2);
  lua_rotate(L, base, NSAVED); /* [lv res frame id trig depth X fn args] */
  ret = lv->orig(L, nargs, nresults, flags);
  top = lua_gettop(L);
  lua_getiuservalue(L, base, LV_LEAVE);
  for (int i = 1; i < NSAVED; i++) lua_pushvalue(L, base + i);
  if (lua_pcall(L, NSAVED - 1, 0, 0) != LUA_OK) luv_report(L, lv, flags);
  lua_rotate(L, base, top - base - NSAVED + 1); /* results below our values */
  lua_settop(L, top - NSAVED);
  return ret;
}

/* Anything the inline paths do not do: the slow path, through the
** ah_luv's closures; in_run: its RUN_LV (checked again: the debug library
** can change it while the loop runs), else the registry's */
static AH_NOINLINE int run_slow(lua_State *L, ah_luv *lv, int in_run,
                                int nargs, int nresults, int flags) {
  if (in_run) {
    if (lua_touserdata(L, RUN_LV) != lv) /* (damaged: see ah_luv_run) */
      return lv->orig(L, nargs, nresults, flags);
    lua_pushvalue(L, RUN_LV);
  } else if (ah_luv_push(L) != lv) { /* (changed meanwhile: damaged) */
    lua_pop(L, 1);
    return lv->orig(L, nargs, nresults, flags);
  }
  return dispatch_slow(L, lv, nargs, nresults, flags);
}

/* ------------------------------------------------------------------- */
/* the inline paths                                                      */

/* The loop runs inside the library's wrapper of uv.run (see register.c), a core
** closure: this C code can use the core's own functions.  Each inline path
** switches the callback's context, lets luv call the user's function
** itself, restores.  The caller checked that nothing below allocates
** (stack reserved, the thread's anchor keys exist, a record's entry in
** lv->cb pushed).  Stack: [X args], while the callback runs [X prev_res
** prev_frame res frame fn args].  A record's resource is not anchored as
** the thread's: R[s] holds it (alive on the stack), and a record that has
** none yet is found through lv->cur if executionAsyncResource() asks
** (ah_luv_resource), which happens once: records get theirs at entry from
** then on.  Three paths, one per kind of callback (run_record, run_quick,
** run_plain), made of the steps below, all inlined: d_save, the path's own
** switch of the frame, d_enter (tracked callbacks), luv's call, d_leave
** (tracked callbacks), d_restore. */

/* what an inline path saves at its entry and restores at its exit (a
** local of the inlined path: its fields live in registers) */
typedef struct dsp {
  int s;        /* the slot of the thread that runs the loop */
  int base;     /* the callback's index: its values are at base + D_* */
  int had;      /* the slot's anchored bits at entry */
  int switched; /* the switch wrote F[s] */
  unsigned fgen; /* st->fgen once switched: still that, nothing else wrote F */
  size_t depth;  /* lv->cb_n below the callback's own entry */
  lua_Integer pid, ptrig;  /* the thread's ids */
  struct ah_luv_cur pcur;  /* lv->cur */
} dsp;

/* save the thread's context; push its resource (false: none, and no
** outer record's marker to keep) and its frame, at base + D_PRES and
** D_PFRAME.  entered: the caller pushed the callback's entry in lv->cb */
static AH_ALWAYS_INLINE void d_save(lua_State *L, ah_luv *lv, ah_state *st,
                                    dsp *d, int s, int base, int entered) {
  d->s = s;
  d->base = base;
  d->had = st->slots[s].anchored;
  d->switched = 0;
  d->depth = lv->cb_n - (size_t)entered;
  d->pid = st->slots[s].id;
  d->ptrig = st->slots[s].trigger;
  d->pcur = lv->cur;
  if ((d->had & A_RES) || d->depth) /* a resource, or an outer record's marker */
    lua_rawgeti(L, AH_UVI_R, s);
  else
    lua_pushboolean(L, 0);
  lua_rawgeti(L, AH_UVI_F, s);
}

/* The switch of the frame: the frame at base + D_FRAME, kept alive by that
** stack slot for as long as the callback runs, becomes the thread's; F[s]
** is written only if something reads it (st->pend_frame: the reader's
** ah_frame_sync calls ah_luv_sync_frame, which finds it on this frame's
** stack), and then only F[s]: the thread's anchor keeps the previous
** frame, and d_restore restores F[s] alone when nothing else wrote it
** meanwhile (any other write goes through set_frame_of, which anchors,
** and counts in st->fgen: then the restore is in full).  The switch
** counts as a write (a re-arm compares st->fgen).  nonempty: not the
** empty frame */
static AH_ALWAYS_INLINE void d_frame(lua_State *L, ah_state *st, dsp *d,
                                     int nonempty) {
  lua_Debug ar; /* this frame's, where the sync finds the frame */
  st->pend_frame = d->s;
  st->pend_idx = d->base + D_FRAME;
  st->pend_ptr = lua_topointer(L, d->base + D_FRAME);
  st->pend_ci = lua_getstack(L, 0, &ar) ? (void *)ar.i_ci : NULL;
  st->fgen++;
  if (nonempty)
    st->slots[d->s].anchored |= A_FRAME;
  else
    st->slots[d->s].anchored &= ~A_FRAME;
  d->switched = 1;
}

/* Enter a tracked callback's context once its ids and frame are switched:
** its resource, lv->cur, its before.  r: its record (NULL: a quick record,
** found at base); has_res: it has a resource, at base + D_RES.  Returns
** nargs, one more when the before's dispatch failed. */
static AH_ALWAYS_INLINE int d_enter(lua_State *L, ah_luv *lv, ah_state *st,
                                    dsp *d, ah_rec *r, lua_Integer id,
                                    int has_res, int nargs) {
  int s = d->s;
  d->fgen = st->fgen; /* before the before hook, which may write a frame */
  if ((d->had & A_RES) && switch_ok(L))
    ah_set_resource(L, s, d->base + D_RES); /* nil: none */
  lv->cur.rec = r;
  lv->cur.id = id;
  lv->cur.slot = s;
  lv->cur.wrote = 0;
  /* its resource is found from it, or made, if asked for (R[s] is
  ** written then); once executionAsyncResource() was called, a record's
  ** resource is written at entry (programs that ask once ask often) */
  lv->cur.base = d->base;
  if (ah_unlikely(has_res && st->res_on)) { /* R[s] holds it (no search) */
    lua_pushvalue(L, d->base + D_RES);
    lua_rawseti(L, AH_UVI_R, s);
    lv->cur.wrote = 1;
  } else if (ah_unlikely(d->depth && !(d->had & A_RES))) {
    /* nested: R[s] may hold the outer one's */
    lua_pushboolean(L, 0);
    lua_rawseti(L, AH_UVI_R, s);
    lv->cur.wrote = 1;
  }
  st->active += 2; /* the callback, and its entry in lv->cb */
  /* (room: ah_luv_run reserved it for this frame) */
  if (ah_unlikely(st->nhooks[AH_BEFORE]) &&
      ah_unlikely(ah_emit_id_reserved(L, st, AH_BEFORE, id))) {
    /* an error of the dispatch (not the hook's own) is the callback's:
    ** luv calls raise_last with it in the callback's place */
    lua_pushcfunction(L, raise_last);
    lua_replace(L, d->base + D_NSAVED + 1);
    nargs++;
  }
  return nargs;
}

/* A tracked callback returned: its after (also for the records an error
** unwound), its entry in lv->cb popped.  1 with the first error of these
** dispatches pushed. */
static AH_ALWAYS_INLINE int d_leave(lua_State *L, ah_luv *lv, ah_state *st,
                                    const dsp *d, lua_Integer id,
                                    int nresults) {
  int err = 0;
  if (ah_unlikely(lv->cb_n != d->depth + 1)) return cb_unwind(L, lv, d->depth);
  if (ah_unlikely(st->nhooks[AH_AFTER])) { /* (room: as for before, unless
                                           ** the callback left results) */
    if (nresults == 0) err = ah_emit_id_reserved(L, st, AH_AFTER, id);
    else err = ah_emit_id(L, st, AH_AFTER, id);
  }
  cb_pop(lv);
  st->active--;
  return err;
}

/* Restore what d_save saved; an error of the dispatches (err: on top) is
** handed to luv once all is restored; the saved values are dropped, the
** callback's results kept.  Returns ret. */
static AH_ALWAYS_INLINE int d_restore(lua_State *L, ah_luv *lv, ah_state *st,
                                      const dsp *d, int err, int ret,
                                      int nresults, int flags) {
  int s = d->s, pres = d->base + D_PRES, pframe = d->base + D_PFRAME;
  st->slots[s].id = d->pid;
  st->slots[s].trigger = d->ptrig;
  if (ah_unlikely((d->had | st->slots[s].anchored) & A_RES)) {
    if (switch_ok(L)) ah_set_resource(L, s, pres);
  } else if (ah_unlikely(lv->cur.wrote)) {
    lua_pushvalue(L, pres);
    lua_rawseti(L, AH_UVI_R, s);
  }
  lv->cur = d->pcur;
  /* the frame: unchanged when nothing wrote one, or nothing read the
  ** switched one (F[s] still holds the previous frame); only F[s] when
  ** only the switch did (the thread's anchor still holds the previous
  ** frame); else in full (F[s] of the thread that runs the loop is
  ** written only here and through set_frame_of, which anchors; both
  ** count).  A callback nested in this one synced this one's frame at its
  ** entry and cleared its own note at its exit: a note for s is this
  ** callback's */
  if (ah_likely(st->pend_frame == s)) {
    st->pend_frame = 0;
    st->fgen++;
    st->slots[s].anchored = (unsigned char)((st->slots[s].anchored & ~A_FRAME) |
                                            (d->had & A_FRAME));
  } else if (ah_likely(st->fgen == d->fgen)) {
    if (d->switched) {
      frame_write(L, st, s, pframe);
      st->slots[s].anchored = (unsigned char)((st->slots[s].anchored & ~A_FRAME) |
                                              (d->had & A_FRAME));
    }
  } else {
    lua_rawgeti(L, AH_UVI_F, s);
    if (!lua_rawequal(L, -1, pframe) && switch_ok(L)) ah_set_frame(L, s, pframe);
    lua_pop(L, 1);
  }
  st->active--;
  if (ah_unlikely(st->dq_n || st->notify_pending) && !st->active && !st->dispatching)
    err = ah_keep_first(L, err, flush_in_run(L, lv, st));
  if (ah_unlikely(err)) luv_report(L, lv, flags);
  if (ah_likely(nresults == 0)) {
    lua_settop(L, d->base - 1);
  } else { /* [X pres pframe res frame results] -> [results] */
    lua_rotate(L, d->base, -(D_NSAVED + 1));
    lua_pop(L, D_NSAVED + 1);
  }
  return ret;
}

/* The record r at base (the caller pushed its entry in lv->cb): inlined
** where it is called, one prologue per callback (the timer chain's path) */
static AH_ALWAYS_INLINE int run_record(lua_State *L, ah_luv *lv, ah_state *st,
                                       int s, ah_rec *r, int base, int nargs,
                                       int nresults, int flags) {
  dsp d;
  /* read at entry: a re-arm from its callback makes r the new
  ** registration's */
  lua_Integer id = r->id;
  const void *rframe = r->frame;
  int oneshot = r->flags & REC_ONESHOT, has_res = r->flags & REC_RES;
  int switched, ret, err;
  d_save(L, lv, st, &d, s, base, 1);
  if (has_res) lua_getiuservalue(L, base, RV_RES); else lua_pushnil(L);
  /* its frame, held on the stack while it runs only if it is switched
  ** (the same as the thread's: F[s] and its anchor hold it) */
  switched = rframe != lua_topointer(L, base + D_PFRAME);
  if (switched) lua_getiuservalue(L, base, RV_FRAME); else lua_pushnil(L);
  lua_getiuservalue(L, base, RV_CB);
  if (nargs) lua_rotate(L, base + 1, D_NSAVED + 1);
  st->slots[s].id = id;
  st->slots[s].trigger = r->trigger;
  if (switched) {
    d_frame(L, st, &d, rframe != st->empty);
    /* F[s] is its frame now: a re-arm from its callback finds it there
    ** without reading F (register.c's rearm) */
    r->fslot = s < AH_FSLOT_MAX ? (unsigned)s : AH_FSLOT_MAX;
    r->fgen = st->fgen;
  }
  nargs = d_enter(L, lv, st, &d, r, id, has_res, nargs);
  ret = lv->orig(L, nargs, nresults, flags);
  err = d_leave(L, lv, st, &d, id, nresults);
  if (oneshot && ah_unlikely(st->nhooks[AH_DESTROY])) ah_queue_destroy(st, id);
  return d_restore(L, lv, st, &d, err, ret, nresults, flags);
}

/* The quick record at base (the caller checked all but the room in
** lv->cb): a function of its own, apart from the rest, so that it is a
** short run of code.  Its values come from its upvalues; its kind is read
** if need be (the destroy of a request), its resource from it
** (lv->cur.base) if asked for; its frame is never the empty one (a quick
** record is made only where a frame is set): it is always switched. */
static AH_NOINLINE int run_quick(lua_State *L, ah_luv *lv, ah_state *st, int s,
                                 int base, int nargs, int nresults, int flags) {
  dsp d;
  lua_Integer trigger, id = ah_luv_q_ids(L, base, &trigger);
  int ret, err;
  if (ah_unlikely(!cb_push(lv, id))) return run_slow(L, lv, 1, nargs, nresults, flags);
  d_save(L, lv, st, &d, s, base, 1);
  lua_pushnil(L);
  lua_getupvalue(L, base, Q_FRAME);
  lua_getupvalue(L, base, Q_CB);
  if (nargs) lua_rotate(L, base + 1, D_NSAVED + 1);
  st->slots[s].id = id;
  st->slots[s].trigger = trigger;
  d_frame(L, st, &d, 1);
  nargs = d_enter(L, lv, st, &d, NULL, id, 0, nargs);
  ret = lv->orig(L, nargs, nresults, flags);
  err = d_leave(L, lv, st, &d, id, nresults);
  if (ah_unlikely(st->nhooks[AH_DESTROY])) { /* a request's (as a record's) */
    const ah_spec *sp;
    lua_getupvalue(L, base, Q_SPEC);
    sp = ah_luv_spec(L, lv, -1);
    lua_pop(L, 1);
    if (sp && sp->kind == W_REQ) ah_queue_destroy(st, id);
  }
  return d_restore(L, lv, st, &d, err, ret, nresults, flags);
}

/* A plain callback, run in the root context, where the thread's context
** is not empty or it is nested in another callback (dispatch_root takes
** the rest): the empty frame, no resource, no before or after. */
static AH_NOINLINE int run_plain(lua_State *L, ah_luv *lv, ah_state *st, int s,
                                 int base, int nargs, int nresults, int flags) {
  dsp d;
  int ret, err = 0;
  d_save(L, lv, st, &d, s, base, 0);
  lua_pushnil(L);
  if (d.had & A_FRAME) lua_rawgeti(L, AH_UVI_AUX, AUX_EMPTY); else lua_pushnil(L);
  lua_pushvalue(L, base);
  if (nargs) lua_rotate(L, base + 1, D_NSAVED + 1);
  st->slots[s].id = 0;
  st->slots[s].trigger = 0;
  lua_pushboolean(L, 0);
  if (d.had & A_FRAME) d_frame(L, st, &d, 0);
  d.fgen = st->fgen;
  lv->cur.rec = NULL;
  lv->cur.id = 0;
  lv->cur.slot = s;
  lv->cur.wrote = 0;
  lv->cur.base = 0;
  if (d.had & A_RES) {
    if (switch_ok(L)) ah_set_resource(L, s, -1);
  } else if (d.depth) { /* nested: R[s] may hold the outer one's */
    lua_pushboolean(L, 0);
    lua_rawseti(L, AH_UVI_R, s);
    lv->cur.wrote = 1;
  }
  lua_pop(L, 1);
  st->active++;
  ret = lv->orig(L, nargs, nresults, flags);
  if (ah_unlikely(lv->cb_n != d.depth)) err = cb_unwind(L, lv, d.depth);
  return d_restore(L, lv, st, &d, err, ret, nresults, flags);
}

/* ------------------------------------------------------------------- */
/* the cb_pcall replacement                                              */

/* The common untracked case: a plain callback arriving while the thread's
** context is empty (uv.run at top level).  Only the ids are switched. */
static AH_ALWAYS_INLINE int dispatch_root(lua_State *L, ah_luv *lv, ah_state *st, int s,
                         int nargs, int nresults, int flags) {
  lua_Integer pid = st->slots[s].id, ptrig = st->slots[s].trigger;
  size_t depth = lv->cb_n;
  int ret;
  st->slots[s].id = st->slots[s].trigger = 0;
  st->active++;
  ret = lv->orig(L, nargs, nresults, flags);
  if (!(st->slots[s].anchored & (A_FRAME | A_RES)) && lv->cb_n == depth &&
      !(st->dq_n && st->active == 1 && !st->dispatching)) {
    lv->fast_callbacks++;
    st->slots[s].id = pid;
    st->slots[s].trigger = ptrig;
    st->active--;
    return ret;
  }
  /* the callback set a value, or an error unwound records, or destroys
  ** are due: the full leave() */
  if (!lua_checkstack(L, NSAVED + 3)) { /* no memory: restore what C can */
    while (lv->cb_n > depth) { cb_pop(lv); st->active--; }
    st->slots[s].id = pid;
    st->slots[s].trigger = ptrig;
    st->active--;
    return ret;
  }
  if (ah_luv_push(L) == lv)
    lua_getiuservalue(L, -1, LV_LEAVE);
  else
    lua_pushnil(L); /* (damaged: the call below fails, nothing restored) */
  lua_remove(L, -2);
  lua_pushnil(L);
  lua_pushnil(L); /* the empty frame */
  lua_pushinteger(L, pid);
  lua_pushinteger(L, ptrig);
  lua_pushinteger(L, (lua_Integer)depth);
  lua_pushnil(L);
  if (lua_pcall(L, 6, 0, 0) != LUA_OK) luv_report(L, lv, flags);
  return ret;
}

/* What the callback at base is, recognised once per callback: a record
** (returned; a record closure at base is replaced by its record, which
** luv then runs), a quick record (*q set), else a plain callback.  The
** records and the closures' upvalues are reachable from Lua: checked. */
static AH_ALWAYS_INLINE ah_rec *recognise(lua_State *L, const ah_luv *lv,
                                          int base, int *q) {
  lua_CFunction f = lua_tocfunction(L, base); /* NULL: not a C function */
  ah_rec *r;
  if (f == ah_luv_q_fn) {
    *q = 1;
    return NULL;
  }
  if (f == ah_luv_rec_fn1 || f == ah_luv_rec_fn) {
    /* a record's closure (register.c makes them, always with a record of
    ** this state: a re-armed slot's, or a registration luv takes only a
    ** function for) */
    if (!lv->closures) return NULL;
    lua_getupvalue(L, base, f == ah_luv_rec_fn1 ? RF1_REC_N : RF_REC_N);
    r = ah_luv_rec_at(L, lv, -1);
    if (r || f == ah_luv_rec_fn) lua_replace(L, base); /* (as ah_luv_record) */
    else lua_pop(L, 1);
    return r;
  }
  if (f || lua_type(L, base) == LUA_TFUNCTION) return NULL;
  return ah_luv_rec_at(L, lv, base); /* a record itself (its __call), maybe */
}

/* uv.walk(fn) calls fn at once, once per handle, through cb_pcall (from
** luv's own C function, the running one): a call in the caller's context,
** not a loop callback */
static int in_walk(lua_State *L, const ah_luv *lv) {
  lua_Debug ar;
  lua_CFunction f;
  if (!lv->walk || !lua_getstack(L, 0, &ar) || !lua_checkstack(L, 1)) return 0;
  lua_getinfo(L, "f", &ar);
  f = lua_tocfunction(L, -1);
  lua_pop(L, 1);
  return f == lv->walk;
}

/* inside a coroutine's before/after emitted from its resumer (a hook that
** runs the loop): the callback's context is its own */
static AH_NOINLINE int in_coroutine_event(lua_State *L, ah_state *st, int nargs,
                                          int nresults, int flags) {
  ah_ov pov = st->ov;
  int ret;
  st->ov.slot = 0;
  ret = ah_luv_cb_pcall(L, nargs, nresults, flags);
  st->ov = pov;
  return ret;
}

/* Debug mode: the callback at base is a plain one (no record of the
** library's) that no wrapper saw, while a value was set somewhere (a frame
** was made): it was registered behind the library's back and runs in the
** empty context.  Reported before it runs (the report leaves it out once
** it heard of it); allocates nothing, raises nothing outside the report's
** protected call. */
static AH_COLD void debug_plain(lua_State *L, const ah_state *st, int nargs) {
  int base = lua_gettop(L) - nargs, t = lua_type(L, base);
  lua_CFunction f = lua_tocfunction(L, base);
  if (t == LUA_TUSERDATA || f == ah_luv_q_fn || f == ah_luv_rec_fn ||
      f == ah_luv_rec_fn1 || !st->lastf)
    return;
  ah_debug_report(L, AH_DEBUG_LUV, base);
}

/* The callback's path: recognised once, the first that fits taken.
** in_run: inside the library's uv.run (the inline paths need its frame:
** its stack reserved, its upvalues). */
static AH_ALWAYS_INLINE int cb_dispatch(lua_State *L, ah_luv *lv, int in_run,
                                        int nargs, int nresults, int flags) {
  ah_state *st = lv->st;
  ah_rec *r = NULL;
  uintptr_t s;
  int known, a, base = 0, q = 0;
  if (ah_unlikely(st->ov.slot)) return in_coroutine_event(L, st, nargs, nresults, flags);
  if (ah_unlikely(st->debug)) debug_plain(L, st, nargs);
  flags |= lv->flags;
  /* the slot from the extra space (safe to read even when the host owns
  ** it: a value passes only if slot s names this very thread); when the
  ** host owns it, the slow path finds the slot */
  s = AH_EXTRA_FITS && st->extra ? ah_extra(L) : UINTPTR_MAX;
  known = ah_likely(s < (uintptr_t)st->cap && st->slots[s].L == L);
  a = known ? st->slots[s].anchored : 0;
  /* no record: none was ever made (nothing was ever tracked) */
  if (lv->records) {
    base = lua_gettop(L) - nargs;
    r = recognise(L, lv, base, &q);
  }
  if (!r && !q && known && !(a & (A_FRAME | A_RES)) &&
      !lv->cb_n) /* nested in a callback: R[s] may hold the outer one's */
    return dispatch_root(L, lv, st, (int)s, nargs, nresults, flags);
  if (!base) base = lua_gettop(L) - nargs;
  /* inline: the thread's anchor keys made; a callback whose resource is
  ** asked for (res_on) and not made yet goes the slow way, which makes it */
  if (in_run && known && (a & (AKEY_FRAME | AKEY_RES)) == (AKEY_FRAME | AKEY_RES)) {
    if (q) {
      if (!st->res_on) return run_quick(L, lv, st, (int)s, base, nargs, nresults, flags);
    } else if (r) {
      if (((r->flags & REC_RES) || !st->res_on) && cb_push(lv, r->id))
        return run_record(L, lv, st, (int)s, r, base, nargs, nresults, flags);
    } else {
      return run_plain(L, lv, st, (int)s, base, nargs, nresults, flags);
    }
  }
  return run_slow(L, lv, in_run, nargs, nresults, flags);
}

/* A callback outside the library's uv.run: the state's ah_luv from the
** registry (reachable from Lua: checked) */
static AH_NOINLINE int outside_run(lua_State *L, int nargs, int nresults, int flags) {
  ah_luv *lv = ah_luv_push(L);
  lua_pop(L, 1);
  if (lv == NULL) { /* the debug library took it away: luv's own */
    ah_luv_pcall orig = ah_load_ptr(ah_luv_fallback);
    return orig(L, nargs, nresults, flags);
  }
  if (in_walk(L, lv)) return lv->orig(L, nargs, nresults, flags | lv->flags);
  return cb_dispatch(L, lv, 0, nargs, nresults, flags);
}

/* Every luv callback comes through here (see the top of the file).  The
** state, the ah_luv and the records come from places reachable from Lua:
** each is checked, and what fails runs the callback as luv would. */
int ah_luv_cb_pcall(lua_State *L, int nargs, int nresults, int flags) {
  if (ah_likely(lua_touserdata(L, RUN_MARK) == (void *)&ah_luv_key))
    /* the frame of the library's uv.run, which checked RUN_LVP */
    return cb_dispatch(L, (ah_luv *)lua_touserdata(L, RUN_LVP), 1, nargs,
                       nresults, flags);
  return outside_run(L, nargs, nresults, flags);
}

/* the library's uv.run: luv's, called in this frame, so that callbacks
** find the core's upvalues (RUN_LV, RUN_MARK after the shared ones).
** Destroys queued outside any callback (a finalizer at top level, a close
** made there) are delivered first; inside the loop every callback's exit
** delivers them (Lua code runs there only inside callbacks), so they arrive
** at the latest on the next loop iteration. */
int ah_luv_run(lua_State *L) {
  ah_state *st = ah_st(L);
  ah_luv *lv = ah_luv_at(L, RUN_LV);
  /* the dispatch uses this frame's upvalues unchecked (it must not raise):
  ** they are checked here, before the loop runs */
  if (lv == NULL || lv->st != st || lv->run == NULL ||
      lua_touserdata(L, RUN_LVP) != lv || !ah_tables_ok(L, AH_TALL))
    return luaL_error(L, "async_hooks: internal state damaged (uv.run)");
  /* room for what the inline paths push: luv pushes each callback and its
  ** arguments inside this very frame (a C call, not a Lua call), whose
  ** reserved top the collector never shrinks below; they run only
  ** when this frame is the running one (RUN_MARK) */
  luaL_checkstack(L, AH_RUN_STACK, "async_hooks");
  /* nested in an inline callback whose frame is not written yet: written
  ** first (the destroys' hooks may read it; this loop's inline callbacks
  ** find theirs in this frame, and need no note from the outer one) */
  if (ah_unlikely(st->pend_frame)) ah_frame_sync(L, st, ah_slot_of(L, st));
  ah_flush_maybe(L, st);
  return lv->run(L);
}

/* the protected closures of the ah_luv at lvi (made with the shared
** upvalues of the calling core function) */
static void push_closure(lua_State *L, lua_CFunction f, int lvi) {
  ah_push_shared(L);
  if (lvi) lua_pushvalue(L, lvi);
  lua_pushcclosure(L, f, AH_NUP + (lvi != 0));
}

void ah_luv_closures(lua_State *L, int lvi) {
  push_closure(L, luv_enter, lvi);
  lua_setiuservalue(L, lvi, LV_ENTER);
  push_closure(L, luv_leave, lvi);
  lua_setiuservalue(L, lvi, LV_LEAVE);
  push_closure(L, luv_flush, 0);
  lua_setiuservalue(L, lvi, LV_FLUSH);
}
