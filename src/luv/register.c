/*
** register.c - luv callbacks run in the context of their registration: the
** registration half (the dispatch half is dispatch.c).
**
** Registration wrappers (`wrapped`) are C closures that stand in for the
** callback-taking luv functions.  A wrapper finds the callback argument,
** and when something could observe it (a hook enabled, a non-empty frame,
** or executionAsyncResource() ever called) hands luv a *record* instead: a
** small userdata with named fields (asyncId, triggerAsyncId, the spec of
** the luv function, flags) and user values (callback, frame, resource or
** handle).  luv's own C function is then called directly, in the wrapper's
** frame, with exactly the caller's arguments: its argument errors read as
** they do without the library and no protected call is needed.  Everything
** that can fail (allocations) happens before luv sees the call, everything
** that changes state after luv accepted it.  Otherwise the user's callback
** goes to luv untouched.
**
** A handle's registration lasts until the same callback slot (the same
** start function) is re-armed on the handle, or the handle is closed;
** requests made on a handle (write, shutdown, udp_send, ...) are separate
** one-shot resources.  The record of a handle's slot is kept in the
** handle's own user value (luv's handles have one that luv never uses): a
** record, or {slot -> record} for a handle with registrations in several
** slots.  Re-arming a slot updates its record in place (timer and idle
** chains, read_start), so a chain allocates nothing per step; closing the
** handle ends them all.
**
** luv's context (registry["luv_context"]) is reached without linking luv or
** libuv: only its first three fields are used, which have kept their layout
** since luv 1.30.
*/
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "private.h"

ah_luv_pcall ah_luv_fallback = NULL;

/* ------------------------------------------------------------------- */
/* a handle's slots (the rest is in record.c)                            */

/* push what the handle at h keeps for slot (the record, or its closure)
** and the record itself above it; returns the record.  NULL: only nil was
** pushed (*closure is -1 when the handle keeps nothing at all). */
static ah_rec *slot_get(lua_State *L, const ah_luv *lv, int h, int slot,
                        int *closure) {
  ah_rec *r;
  switch (lua_getiuservalue(L, h, 1)) {
    case LUA_TNIL: /* nothing kept (a fresh handle) */
      *closure = -1;
      return NULL;
    case LUA_TTABLE:
      lua_rawgeti(L, -1, slot);
      lua_remove(L, -2);
      break;
    default: break;
  }
  if (lua_tocfunction(L, -1) == ah_luv_rec_fn1) {
    lua_getupvalue(L, -1, RF1_REC_N); /* only rearm makes these: a record */
    /* (checked: reachable from Lua; the record whose callback runs inline,
    ** a re-arm from inside it, was checked by the dispatch) */
    r = (ah_rec *)lua_touserdata(L, -1);
    if (r == NULL || r != lv->cur.rec) r = ah_luv_rec_at(L, lv, -1);
    *closure = 1;
  } else {
    r = ah_luv_record(L, lv, -1);
    lua_pushvalue(L, -1);
    *closure = 0;
  }
  if (!r || r->spec->slot != slot) {
    lua_pop(L, 2);
    lua_pushnil(L);
    return NULL;
  }
  return r;
}

/* ------------------------------------------------------------------- */
/* registration wrappers                                                 */

static int observable(ah_state *st, int s) {
  return st->watched || (st->slots[s].anchored & A_FRAME);
}

/* the position of the callback argument, or 0 (a synchronous call) */
static int find_callback(lua_State *L, const ah_spec *sp) {
  int n;
  /* pos < 16 is an acceptable index (LUA_MINSTACK): none beyond the top */
  if (lua_type(L, sp->pos) == LUA_TFUNCTION) return sp->pos;
  n = lua_gettop(L);
  if (sp->pos <= n && ah_callable(L, sp->pos)) return sp->pos;
  if (sp->alt && sp->alt <= n && ah_callable(L, sp->alt) &&
      (sp->pos > n || lua_isnil(L, sp->pos)))
    return sp->alt;
  return 0;
}

/* debug mode: the callback of this call is one a wrapper saw (dispatch.c
** reports the plain callbacks that none did) */
static AH_COLD void debug_note(lua_State *L, const ah_spec *sp) {
  int pos = find_callback(L, sp);
  if (pos) ah_debug_seen(L, pos);
}

/* luv accepted the registration of r (at rec, 0: lost): its init (with
** its resource when an init hook can see it).  Returns 1 with an error of
** the dispatch pushed: the registration's, raised once it is complete */
static int registered(lua_State *L, ah_state *st, ah_rec *r,
                                       int rec, int handle_idx) {
  if (st->nhooks[AH_INIT]) {
    luaL_checkstack(L, AH_INIT_ARGS_STACK, "async_hooks");
    ah_luv_push_type(L, handle_idx);
    ah_luv_push_init_resource(L, st, r, rec);
    if (ah_emit_init_v(L, st, r->id, -2, r->trigger, -1)) {
      lua_replace(L, -3);
      lua_pop(L, 1);
      return 1;
    }
    lua_pop(L, 2);
  }
  return 0;
}

/* push a new record for the callback at pos, in the context of slot s
** (n arguments) */
static ah_rec *new_record(lua_State *L, ah_state *st, const ah_spec *sp,
                          int pos, int s, int handle_idx, int n) {
  int eager = st->init_res || st->res_on || sp->kind == W_CREATE;
  int a1 = sp->nf > 0 && sp->f[0] <= n ? sp->f[0] : 0;
  int a2 = sp->nf > 1 && sp->f[1] <= n ? sp->f[1] : 0;
  ah_rec *r = (ah_rec *)lua_newuserdatauv(L, sizeof(ah_rec),
                                          RV_N + (eager ? 0 : sp->nf));
  int rec = lua_gettop(L);
  sp->lv->records = 1;
  r->lv = sp->lv;
  r->id = 0;
  r->trigger = st->slots[s].id;
  r->spec = sp;
  r->flags = (sp->kind == W_CLOSE || sp->kind == W_REQ) ? REC_ONESHOT : 0;
  if (st->nhooks[AH_DESTROY]) r->flags |= REC_DESTROY;
  if (lua_type(L, W_RECMT) != LUA_TTABLE) /* (nothing changed yet) */
    luaL_error(L, "async_hooks: internal state damaged (records' metatable)");
  lua_pushvalue(L, W_RECMT);
  lua_setmetatable(L, rec);
  lua_pushvalue(L, pos);
  lua_setiuservalue(L, rec, RV_CB);
  ah_frame_sync(L, st, s);
  lua_rawgeti(L, AH_UV_F, s);
  r->frame = lua_topointer(L, -1);
  r->fslot = s < AH_FSLOT_MAX ? (unsigned)s : AH_FSLOT_MAX;
  r->fgen = st->fgen;
  lua_setiuservalue(L, rec, RV_FRAME);
  if (eager) {
    ah_luv_new_resource(L, W_SPEC, handle_idx, a1, a2);
    if (sp->kind == W_CREATE) { /* the handle comes later: make the key */
      lua_pushboolean(L, 0);
      lua_setfield(L, -2, "handle");
    }
    r->flags |= REC_RES;
    lua_setiuservalue(L, rec, RV_RES);
  } else { /* what a resource made later needs (user values start nil) */
    if (a1) {
      lua_pushvalue(L, a1);
      lua_setiuservalue(L, rec, RV_A1);
    }
    if (a2) {
      lua_pushvalue(L, a2);
      lua_setiuservalue(L, rec, RV_A1 + 1);
    }
    if (handle_idx) {
      lua_pushvalue(L, handle_idx);
      lua_setiuservalue(L, rec, RV_RES);
    }
  }
  return r;
}

/* The slot of the handle at 1 is re-armed: its record r (at n+2; at n+1
** what the handle keeps, the record or its closure) is
** updated in place once luv accepted it.  luv's start functions ignore
** values after their callback, which carry the new callback and resource. */
static int rearm(lua_State *L, ah_state *st, const ah_spec *sp, int s,
                 int n, int pos, ah_rec *r, int closure) {
  int nres, destroy = st->nhooks[AH_DESTROY] != 0;
  int res = st->init_res || st->res_on, fresh = 0;
  int fnv = n + 1, rec = n + 2, cb = n + 3; /* Lua guarantees LUA_MINSTACK */
  lua_Integer id, old;
  /* luv is handed the record's closure, not the record: luv's callable
  ** check is cheap on a function and dear on a userdata (a __call lookup) */
  if (!closure) { /* first re-arm: make it */
    lua_pushvalue(L, rec);
    lua_pushcclosure(L, ah_luv_rec_fn1, RF1_REC_N);
    lua_replace(L, fnv);
    fresh = 1;
  }
  lua_pushvalue(L, pos); /* cb */
  if (res) ah_luv_new_resource(L, W_SPEC, 1, 0, 0); /* cb + 1 */
  lua_copy(L, fnv, pos);
  id = st->next_id++;
  nres = sp->orig(L);
  /* accepted: the old registration ends, the new one begins */
  if (fresh) { /* the handle keeps the closure (replaces: no allocation) */
    sp->lv->closures = 1;
    if (lua_getiuservalue(L, 1, 1) == LUA_TTABLE) {
      lua_pushvalue(L, fnv);
      lua_rawseti(L, -2, sp->slot);
      lua_pop(L, 1);
    } else {
      lua_pop(L, 1);
      lua_pushvalue(L, fnv);
      lua_setiuservalue(L, 1, 1);
    }
  }
  old = r->id;
  r->id = id;
  r->spec = sp; /* signal_start and signal_start_oneshot share a slot: the
                ** resource made later names the function that took it */
  r->trigger = st->slots[s].id;
  lua_pushvalue(L, cb);
  lua_setiuservalue(L, rec, RV_CB);
  /* the frame: the one kept when no F[] was written since it was read */
  if (r->fgen != st->fgen || (int)r->fslot != s || s >= AH_FSLOT_MAX) {
    ah_frame_sync(L, st, s);
    lua_geti(L, AH_UVI_F, s); /* (raises unless F can be indexed) */
    if (lua_topointer(L, -1) != r->frame) {
      r->frame = lua_topointer(L, -1);
      lua_setiuservalue(L, rec, RV_FRAME);
    } else {
      lua_pop(L, 1);
    }
    r->fslot = s < AH_FSLOT_MAX ? (unsigned)s : AH_FSLOT_MAX;
    r->fgen = st->fgen;
  }
  if ((r->flags & REC_RES) && r == sp->lv->cur.rec && old == sp->lv->cur.id) {
    /* its callback runs: its resource stays the running one's (pinned at
    ** the first re-arm inside it: a second one finds the first one's) */
    lua_getiuservalue(L, rec, RV_RES);
    if (st->slots[sp->lv->cur.slot].id == old) {
      lua_rawseti(L, AH_UV_R, sp->lv->cur.slot);
      sp->lv->cur.wrote = 1;
    } else { /* a scope or a nested callback holds the slot's resource
             ** (another id runs there): kept on the dispatch's stack, where
             ** ah_luv_resource finds it once they are gone */
      ah_luv_set_cur_local(L, sp->lv, D_RES);
    }
  }
  if (res || (r->flags & REC_RES)) {
    lua_pushvalue(L, res ? cb + 1 : 1);
    lua_setiuservalue(L, rec, RV_RES);
    r->flags = (unsigned char)(res ? r->flags | REC_RES : r->flags & ~REC_RES);
  }
  if ((r->flags & REC_DESTROY) && destroy) ah_queue_destroy(st, old);
  r->flags = (unsigned char)(destroy ? r->flags | REC_DESTROY : r->flags & ~REC_DESTROY);
  if (st->nhooks[AH_INIT] && registered(L, st, r, rec, 1)) return ah_raise(L);
  return nres;
}

/* luv refused the call and returned nil, err, name (the callback will not
** run, unless kept() below): no init, nothing kept */
#define LUV_FAILED(L, nres) ((nres) > 0 && lua_type((L), -(nres)) == LUA_TNIL)

/* luv refused a start of the handle at 1 with nil, err after it had taken
** the callback (every handle start stores it first): unless the handle is
** closing, the callback runs on the handle's events from now on (read_start
** on a reading stream: EALREADY), so the registration counts as made (its
** init now, its destroy when the handle closes or is re-armed).  luv's
** is_closing reads the handle at 1 and pushes a boolean. */
static int kept(lua_State *L, const ah_luv *lv, const ah_spec *sp, int handle_idx) {
  int closing;
  if (sp->kind != W_HANDLE || handle_idx != 1 || !lv->is_closing) return 0;
  lv->is_closing(L);
  closing = lua_toboolean(L, -1);
  lua_pop(L, 1);
  return !closing;
}

/* a quick record (see private.h) takes the callback's place: a request while
** executionAsyncResource() was never called (with hooks or without: a
** request's destroy follows its one callback), or the first registration
** on a fresh handle while nothing but a frame observes it.  With init
** hooks, its resource is made at once (its Q_RES) and its init emitted
** once luv accepted it.  The handle keeps `true` once luv accepted it: it
** was tracked, so a re-arm takes the record path, which keeps its record
** there and reuses it (a chain allocates nothing per step).  Returns -1,
** having changed nothing, when a finalizer run by an allocation made the
** registration need a record (a hook, a resource asked for), or when its
** ids do not fit in one integer (ah_luv_q_pack). */
/* track_q's pushes with a resource: it, then the closure's upvalues */
#define TRACK_Q_STACK (1 + Q_N + 2)

static int track_q(lua_State *L, ah_state *st, const ah_spec *sp, int s,
                   int n, int pos, int handle_idx) {
  int i, nres, nup = Q_N + sp->nf; /* at most 8 pushes: within LUA_MINSTACK */
  int init = st->nhooks[AH_INIT] != 0, res = init && st->init_res, a1, a2;
  lua_Integer id, ids, trigger = st->slots[s].id;
  const void *qp;
  if (ah_unlikely(!ah_luv_q_pack(st->next_id, trigger, &ids)))
    return -1; /* ids too far apart for one integer: a record */
  if (ah_unlikely(res)) { /* (a request's) */
    luaL_checkstack(L, TRACK_Q_STACK, "async_hooks");
    a1 = sp->nf > 0 && sp->f[0] <= n ? sp->f[0] : 0;
    a2 = sp->nf > 1 && sp->f[1] <= n ? sp->f[1] : 0;
    ah_luv_new_resource(L, W_SPEC, handle_idx, a1, a2); /* n+1: can fail */
  }
  id = st->next_id++; /* taken first: a finalizer may take ids meanwhile */
  if (ah_unlikely(id != (ids >> AH_Q_TBITS)) && !ah_luv_q_pack(id, trigger, &ids)) {
    lua_settop(L, n);
    return -1;
  }
  lua_pushvalue(L, pos);               /* Q_CB */
  ah_frame_sync(L, st, s);
  lua_rawgeti(L, AH_UV_F, s);          /* Q_FRAME */
  lua_pushinteger(L, ids);             /* Q_IDS */
  lua_pushvalue(L, W_SPEC);            /* Q_SPEC */
  if (ah_unlikely(res)) lua_pushvalue(L, n + 1); /* Q_RES: the resource, */
  else if (handle_idx) lua_pushvalue(L, handle_idx); /* else the handle */
  else lua_pushnil(L);
  for (i = 0; i < sp->nf; i++) { /* Q_A1... */
    if (sp->f[i] <= n) lua_pushvalue(L, sp->f[i]); else lua_pushnil(L);
  }
  lua_pushcclosure(L, ah_luv_q_fn, nup); /* can fail: before any change */
  if (ah_unlikely(sp->kind == W_REQ ? st->res_on || (st->nhooks[AH_INIT] != 0) != init ||
                                          (init && (st->init_res != 0) != res)
                                    : st->watched)) {
    lua_settop(L, n);
    return -1;
  }
  lua_replace(L, pos);
  sp->lv->records = 1;
  if (ah_likely(!init)) {
    nres = sp->orig(L);
  } else { /* its init, with the resource from the closure when a hook
           ** can see it (luv may have moved its arguments: then none, as
           ** for a record) */
    lua_settop(L, n); /* luv's function sees exactly the caller's arguments */
    qp = lua_topointer(L, pos);
    nres = sp->orig(L);
    if (LUV_FAILED(L, nres)) return nres;
    luaL_checkstack(L, AH_INIT_ARGS_STACK, "async_hooks");
    ah_luv_push_type(L, handle_idx);
    if (lua_topointer(L, pos) != qp) /* moved: as for a lost record */
      lua_pushnil(L);
    else if (res) /* made above */
      lua_getupvalue(L, pos, Q_RES);
    else /* an init hook that sees it was enabled meanwhile, or none */
      ah_luv_push_init_resource(L, st, NULL, pos);
    if (ah_emit_init_v(L, st, id, -2, trigger, -1)) { /* the call's error, */
      lua_replace(L, -3);
      lua_pop(L, 1);
      if (sp->kind == W_HANDLE) { /* raised once the handle is marked */
        lua_pushboolean(L, 1);
        lua_setiuservalue(L, 1, 1);
      }
      return ah_raise(L);
    }
    lua_pop(L, 2);
  }
  if (sp->kind == W_HANDLE && (!LUV_FAILED(L, nres) || kept(L, sp->lv, sp, 1))) {
    /* accepted (or taken all the same); no allocation */
    lua_pushboolean(L, 1);
    lua_setiuservalue(L, 1, 1);
  }
  return nres;
}

/* the handle at 1 keeps nothing */
static int fresh_handle(lua_State *L) {
  int t = lua_getiuservalue(L, 1, 1);
  lua_pop(L, 1);
  return t == LUA_TNIL;
}

/* track's pushes: the record, its closure, its resource (made eagerly) */
#define TRACK_STACK (AH_LUV_RES_STACK + 4)

/* a new record takes the callback's place; stack: the n arguments (fresh:
** the handle at 1 keeps nothing, as its user value was just read) */
static AH_NOINLINE int track(lua_State *L, ah_state *st, ah_luv *lv,
                 const ah_spec *sp, int s, int n, int pos, int fresh) {
  int nres, rec;
  int handle_idx = sp->kind != W_CREATE && sp->kind != W_WORK &&
                   lua_type(L, 1) == LUA_TUSERDATA ? 1 : 0;
  int keep = sp->kind == W_HANDLE && handle_idx;
  ah_rec *r;
  luaL_checkstack(L, TRACK_STACK, "async_hooks");
  /* everything that can fail, before luv sees anything */
  if (keep) keep = fresh ? AH_SLOT_NIL : ah_luv_slot_reserve(L, lv, 1, sp->slot);
  r = new_record(L, st, sp, pos, s, handle_idx, n); /* n+1 */
  if (sp->fn) {
    sp->lv->closures = 1;
    ah_push_shared(L);
    lua_pushvalue(L, n + 1);
    lua_pushcclosure(L, ah_luv_rec_fn, RF_REC_N);
  }
  lua_replace(L, pos);
  lua_settop(L, n);
  r->id = st->next_id++;
  /* luv's function, in our frame, with exactly the caller's arguments */
  nres = sp->orig(L);
  if (LUV_FAILED(L, nres) && !kept(L, lv, sp, handle_idx)) return nres;
  if (sp->fn) lua_getupvalue(L, pos, RF_REC_N); else lua_pushvalue(L, pos);
  rec = lua_gettop(L);
  if (lua_touserdata(L, rec) != (void *)r) { /* luv moved its arguments */
    if (registered(L, st, r, 0, 0)) return ah_raise(L);
    lua_pop(L, 1);
    return nres;
  }
  if (keep) {
    ah_luv_slot_set(L, lv, 1, sp->slot, rec, keep);
  } else if (sp->kind == W_CLOSE && lv->handles && handle_idx) {
    ah_luv_slot_drop(L, st, lv, 1, 0);
  } else if (sp->kind == W_CREATE && nres > 0 &&
             lua_type(L, rec - nres) == LUA_TUSERDATA) {
    handle_idx = rec - nres; /* the handle luv made */
    lua_getiuservalue(L, rec, RV_RES);
    lua_pushvalue(L, handle_idx);
    lua_setfield(L, -2, "handle"); /* the key exists */
    lua_pop(L, 1);
    int reserved = ah_luv_slot_reserve(L, lv, handle_idx, sp->slot);
    if (reserved) /* a fresh handle: no allocation */
      ah_luv_slot_set(L, lv, handle_idx, sp->slot, rec, reserved);
  }
  if (registered(L, st, r, rec, handle_idx)) return ah_raise(L);
  lua_pop(L, 1);
  return nres;
}

/* the rest of wrapped(): something observes the registration, or a
** tracked handle registration may end here */
static AH_NOINLINE int wrapped_tracked(lua_State *L, const ah_spec *sp,
                                       ah_state *st, int s, int obs) {
  int pos = find_callback(L, sp), nres, n;
  ah_luv *lv = sp->lv;
  if (pos && obs) {
    int closure = 0, udata = lua_type(L, 1) == LUA_TUSERDATA;
    n = lua_gettop(L);
    if (sp->kind == W_HANDLE && lv->handles && udata) {
      ah_rec *r = slot_get(L, lv, 1, sp->slot, &closure); /* n+1, n+2 */
      if (r) return rearm(L, st, sp, s, n, pos, r, closure);
      lua_pop(L, 1);
    }
    /* a quick record: a request, or the first registration on a fresh
    ** handle (its user value read by slot_get, else here), while nothing
    ** but a frame observes it */
    if (sp->kind == W_REQ ? !st->res_on
                          : sp->kind == W_HANDLE && udata && !st->watched &&
                                (closure == -1 || (!lv->handles && fresh_handle(L)))) {
      nres = track_q(L, st, sp, s, n, pos, sp->kind == W_REQ ? udata : 1);
      if (nres >= 0) return nres;
    }
    return track(L, st, lv, sp, s, n, pos, closure == -1);
  }
  if (!lv->handles || !(sp->kind == W_CLOSE || (pos && sp->kind == W_HANDLE)) ||
      lua_type(L, 1) != LUA_TUSERDATA)
    return sp->orig(L); /* the common case: luv's function, nothing else */
  /* a tracked registration of the handle ends: closed, or replaced by an
  ** untracked callback (dropping the record at once, not when the handle
  ** is collected, keeps what its callback holds out of the collector's
  ** old generation) */
  nres = sp->orig(L);
  luaL_checkstack(L, AH_LUV_SLOT_STACK, "async_hooks");
  ah_luv_slot_drop(L, st, lv, 1, sp->kind == W_CLOSE ? 0 : sp->slot);
  return nres;
}

/* The specs checked last, by the address of their block (see ah_st in
** base.h for why a value whose block is at the address of a spec checked
** before is that spec): a small cache, a few per Lua state in use, which
** forget_specs empties of a state's specs when the state is closed */
#define AH_SPECS_KNOWN 16
static const ah_spec *specs_known[AH_SPECS_KNOWN];
/* one of them, else the address of this very variable (no userdata's
** block: nothing passes for it, see ah_known in base.c) */
#define SPEC_NONE ((const ah_spec *)(const void *)&spec_last)
static const ah_spec *spec_last = SPEC_NONE;
#define SPEC_HASH(p) ((unsigned)(((uintptr_t)(p) >> 4) * 2654435761u) >> 28)
typedef char ah_specs_known_size[AH_SPECS_KNOWN == 16 ? 1 : -1];

static AH_NOINLINE const ah_spec *check_spec(lua_State *L) {
  ah_state *st = ah_st(L);
  ah_luv *lv = ah_luv_at(L, W_LV);
  const ah_spec *sp = ah_luv_spec(L, lv && lv->st == st ? lv : NULL, W_SPEC);
  if (sp == NULL)
    luaL_error(L, "async_hooks: internal state damaged (upvalue %d of a luv "
                  "function)", AH_NUP + 1);
  if (!st->closed && !lv->closed) ah_store_ptr(specs_known[SPEC_HASH(sp)], sp);
  return sp;
}

/* the ah_luv lv is finalized (lua_close): its specs leave the cache (they
** are freed once every finalizer has run) */
static void forget_specs(const ah_luv *lv) {
  int i;
  for (i = 0; i < AH_SPECS_KNOWN; i++) {
    const ah_spec *sp = ah_load_ptr(specs_known[i]);
    if (sp && sp->lv == lv) ah_store_ptr(specs_known[i], NULL);
  }
  ah_store_ptr(spec_last, SPEC_NONE);
}

/* The stand-in for a callback-taking luv function.  When nothing can
** observe the registration and no tracked handle registration exists, it
** is luv's function and a few tests (a small frame of its own: the rest is
** in wrapped_tracked). */
static int wrapped(lua_State *L) {
  const ah_spec *sp = (const ah_spec *)lua_touserdata(L, W_SPEC);
  ah_luv *lv;
  ah_state *st;
  int s, obs;
  /* (the one checked last first: a chain calls the same function) */
  if (ah_unlikely(sp != ah_load_ptr(spec_last) || sp->self != sp)) {
    if (sp == NULL || sp != ah_load_ptr(specs_known[SPEC_HASH(sp)]) || sp->self != sp)
      sp = check_spec(L);
    /* (not once finalized: forget_specs has run, and the spec's memory
    ** goes with the state; luv's loop finalizer runs callbacks after it) */
    if (!sp->lv->closed) ah_store_ptr(spec_last, sp);
  }
  lv = sp->lv;
  st = lv->st;
  if (ah_unlikely(st->debug)) debug_note(L, sp);
  s = ah_slot_of(L, st);
  obs = observable(st, s);
  if (ah_likely(!obs && !lv->handles))
    return sp->orig(L); /* nothing to track, no tracked handle to end */
  /* no callback (a synchronous call, a close without one) and no tracked
  ** handle registration to end: as wrapped_tracked would (pos < 16: an
  ** acceptable index) */
  if (!lv->handles && !sp->alt && lua_type(L, sp->pos) <= LUA_TNIL)
    return sp->orig(L);
  return wrapped_tracked(L, sp, st, s, obs);
}

static ah_luv *luv_state(lua_State *L);

/* the field k of the spec table at 2, an integer in [lo, hi] (def when
** absent) */
static int spec_int(lua_State *L, const char *k, int lo, int hi, int def) {
  lua_Integer v = def;
  int isnum = 1;
  if (lua_getfield(L, 2, k) != LUA_TNIL) v = lua_tointegerx(L, -1, &isnum);
  lua_pop(L, 1);
  if (!isnum || v < lo || v > hi)
    return luaL_error(L, "bad luv_wrap spec: field '%s'", k);
  return (int)v;
}

/* luv_wrap(orig, spec) -> wrapper.  spec: {op = name, kind = one of
** kind_names, pos = callback position, alt = alternative position (used
** when pos is nil or absent), type = resource type (nil: the handle's),
** slot = callback slot of handle registrations, fn = luv takes only a
** function there, fields = {name, position, ...}: up to two arguments
** copied into the resource (`path`, `host`, ...)}.  op names the resource
** (its field `op`). */
static const char *const kind_names[] = {
  "handle", "create", "close", "request", "work", NULL
};
typedef char ah_kind_names_match[W_WORK == 4 && W_HANDLE == 0 ? 1 : -1];

static int l_luv_wrap(lua_State *L) {
  lua_CFunction f = lua_tocfunction(L, 1);
  ah_spec *sp;
  int i, kind;
  luaL_argexpected(L, f != NULL && lua_getupvalue(L, 1, 1) == NULL, 1,
                   "C function without upvalues");
  luaL_checktype(L, 2, LUA_TTABLE);
  lua_settop(L, 2);
  /* the spec's fields, 3 .. 6: op, kind, type, fields */
  if (lua_getfield(L, 2, "op") != LUA_TSTRING)
    return luaL_error(L, "bad luv_wrap spec: field 'op' (string expected)");
  lua_getfield(L, 2, "kind");
  for (kind = 0; kind_names[kind]; kind++)
    if (lua_type(L, 4) == LUA_TSTRING && strcmp(lua_tostring(L, 4), kind_names[kind]) == 0)
      break;
  if (!kind_names[kind])
    return luaL_error(L, "bad luv_wrap spec: invalid kind '%s'", luaL_optstring(L, 4, "nil"));
  if (lua_getfield(L, 2, "type") != LUA_TNIL && !lua_isstring(L, 5))
    return luaL_error(L, "bad luv_wrap spec: field 'type'");
  if (lua_getfield(L, 2, "fields") != LUA_TNIL && !lua_istable(L, 6))
    return luaL_error(L, "bad luv_wrap spec: field 'fields'");
  luv_state(L); /* 7 */
  lua_getiuservalue(L, 7, LV_SPECS); /* 8 */
  sp = (ah_spec *)lua_newuserdatauv(L, sizeof(ah_spec), SP_NUV); /* 9 */
  sp->self = sp;
  sp->lv = (ah_luv *)lua_touserdata(L, 7);
  ah_internal_mt(L, 9);
  sp->orig = f;
  sp->kind = kind;
  /* positions < 16: acceptable indices (LUA_MINSTACK) */
  sp->pos = spec_int(L, "pos", 1, 15, 0);
  sp->alt = spec_int(L, "alt", 0, 15, 0);
  sp->slot = spec_int(L, "slot", 0, INT_MAX, 0);
  lua_getfield(L, 2, "fn");
  sp->fn = lua_toboolean(L, -1);
  lua_pop(L, 1);
  sp->nf = 0;
  for (i = 0; i < 2 && lua_istable(L, 6); i++) {
    lua_Integer fp;
    if (lua_rawgeti(L, 6, 2 * i + 1) == LUA_TNIL) { lua_pop(L, 1); break; }
    if (lua_type(L, -1) != LUA_TSTRING)
      return luaL_error(L, "bad luv_wrap spec: bad field name");
    lua_setiuservalue(L, 9, SP_F1 + i);
    lua_rawgeti(L, 6, 2 * i + 2);
    fp = lua_tointeger(L, -1);
    if (fp < 1 || fp >= 16)
      return luaL_error(L, "bad luv_wrap spec: bad field position");
    lua_pop(L, 1);
    sp->f[i] = (int)fp;
    sp->nf = i + 1;
  }
  lua_pushvalue(L, 3);
  lua_setiuservalue(L, 9, SP_OP);
  lua_pushvalue(L, 5);
  lua_setiuservalue(L, 9, SP_TYPE);
  lua_pushliteral(L, "op");
  lua_setiuservalue(L, 9, SP_KOP);
  lua_pushliteral(L, "handle");
  lua_setiuservalue(L, 9, SP_KHANDLE);
  lua_pushvalue(L, 9);
  lua_rawsetp(L, 8, sp); /* anchored for the life of the state */
  luaL_checkstack(L, W_NUP, "async_hooks");
  ah_push_shared(L);
  lua_pushvalue(L, 9);
  lua_pushvalue(L, 7);
  lua_getiuservalue(L, 7, LV_RECMT);
  lua_pushcclosure(L, wrapped, W_NUP);
  return 1;
}

/* luv_wrap_run(run) -> the library's uv.run (see dispatch.c) */
static int l_luv_wrap_run(lua_State *L) {
  lua_CFunction f = lua_tocfunction(L, 1);
  ah_luv *lv;
  luaL_argexpected(L, f != NULL && lua_getupvalue(L, 1, 1) == NULL, 1,
                   "C function without upvalues");
  lua_settop(L, 1);
  lv = luv_state(L); /* 2 */
  lv->run = f;
  luaL_checkstack(L, RUN_NUP, "async_hooks");
  ah_push_shared(L);
  lua_pushvalue(L, 2);
  lua_pushlightuserdata(L, lv); /* RUN_LVP */
  lua_pushnil(L);
  lua_pushlightuserdata(L, (void *)&ah_luv_key); /* RUN_MARK, last */
  lua_pushcclosure(L, ah_luv_run, RUN_NUP);
  return 1;
}

/* ------------------------------------------------------------------- */
/* set-up                                                                */

/* __gc of the ah_luv (lua_close): its native stack goes, its specs leave
** the cache.  Callbacks can still run afterwards (luv's loop finalizer
** runs pending ones): the inline stack stays, nothing allocates. */
static int luv_gc(lua_State *L) {
  ah_luv *lv = ah_luv_at(L, 1); /* (the metatable is reachable from Lua) */
  if (lv == NULL) return 0;
  lv->closed = 1;
  forget_specs(lv);
  if (lv->cb != lv->cb_inline) free(lv->cb);
  lv->cb = lv->cb_inline;
  lv->cb_cap = AH_CB_INLINE;
  lv->cb_n = 0;
  return 0;
}

/* push the state's ah_luv, made the first time */
static ah_luv *luv_state(lua_State *L) {
  ah_state *st = ah_st(L);
  ah_luv *lv;
  int i;
  if ((lv = ah_luv_push(L)) != NULL) return lv;
  lua_pop(L, 1); /* (nothing, or what the debug library put there) */
  luaL_checkstack(L, AH_NUP + 6, "async_hooks");
  lv = (ah_luv *)lua_newuserdatauv(L, sizeof(ah_luv), LV_NUV);
  memset(lv, 0, sizeof *lv);
  lv->self = lv;
  lv->st = st;
  lv->cb = lv->cb_inline;
  lv->cb_cap = AH_CB_INLINE;
  i = lua_gettop(L);
  lua_createtable(L, 0, 2);
  lua_pushliteral(L, "async_hooks.luv");
  lua_setfield(L, -2, "__name");
  lua_pushcfunction(L, luv_gc);
  lua_setfield(L, -2, "__gc");
  lua_setmetatable(L, i);
  ah_luv_closures(L, i);
  lua_createtable(L, 0, 2); /* records' metatable */
  lua_pushliteral(L, "async_hooks.luv_callback");
  lua_setfield(L, -2, "__name");
  ah_push_shared(L);
  lua_pushcclosure(L, ah_luv_rec_call, AH_NUP);
  lua_setfield(L, -2, "__call");
  lua_setiuservalue(L, i, LV_RECMT);
  lua_newtable(L);
  lua_setiuservalue(L, i, LV_SPECS);
  lua_pushvalue(L, i);
  lua_rawsetp(L, LUA_REGISTRYINDEX, &ah_luv_key); /* complete, anchored */
  return lv;
}

/* luv keeps every callback as a registry reference (luaL_ref, reused last
** freed first).  The library's own registry entries, made at install, push
** the next fresh reference past the registry's array part, and a callback
** re-armed step after step then keeps a reference in its hash part, where
** each of luv's lookups costs about twice as much.  Taking AH_WARM_REFS fresh references
** and freeing them, highest first, grows the array part over them and
** leaves the lowest at the head of the free list, where luv finds them. */
#define AH_WARM_REFS 32
static void warm_registry(lua_State *L) {
  int refs[AH_WARM_REFS], i;
  for (i = 0; i < AH_WARM_REFS; i++) {
    lua_pushboolean(L, 0);
    refs[i] = luaL_ref(L, LUA_REGISTRYINDEX);
  }
  for (i = AH_WARM_REFS - 1; i >= 0; i--)
    luaL_unref(L, LUA_REGISTRYINDEX, refs[i]);
}

/* luv_attach([walk, is_closing]): take over luv's cb_pcall (idempotent);
** walk is luv's uv.walk, whose callbacks are calls, not loop callbacks;
** is_closing is luv's uv.is_closing */
static int l_luv_attach(lua_State *L) {
  ah_luv *lv;
  ah_luv_ctx *ctx;
  lua_CFunction walk = lua_tocfunction(L, 1), is_closing = lua_tocfunction(L, 2);
  if (lua_getfield(L, LUA_REGISTRYINDEX, "luv_context") != LUA_TUSERDATA ||
      lua_rawlen(L, -1) < sizeof(ah_luv_ctx))
    return luaL_error(L, "luv is not loaded in this Lua state");
  ctx = (ah_luv_ctx *)lua_touserdata(L, -1);
  lv = luv_state(L);
  if (walk) lv->walk = walk;
  if (is_closing) lv->is_closing = is_closing;
  if (ctx->cb_pcall == ah_luv_cb_pcall) return 0;
  lv->ctx = ctx;
  lv->orig = ctx->cb_pcall;
  if (ah_load_ptr(ah_luv_fallback) == NULL) ah_store_ptr(ah_luv_fallback, lv->orig);
  ctx->cb_pcall = ah_luv_cb_pcall;
  warm_registry(L);
  return 0;
}

/* luv_detach(): give cb_pcall back */
static int l_luv_detach(lua_State *L) {
  ah_luv *lv = ah_luv_push(L);
  if (lv && lv->ctx && lv->ctx->cb_pcall == ah_luv_cb_pcall) lv->ctx->cb_pcall = lv->orig;
  return 0;
}

/* luv_flags(n): LUVF_CALLBACK_* flags added to every callback (for tests
** that need a callback error not to end the process) */
static int l_luv_flags(lua_State *L) {
  ah_luv *lv;
  int flags = (int)luaL_checkinteger(L, 1);
  lv = ah_luv_push(L);
  luaL_argcheck(L, lv != NULL && lv->ctx != NULL, 1, "luv integration not attached");
  lv->flags = flags;
  return 0;
}

static int l_luv_attached(lua_State *L) {
  ah_luv_ctx *ctx = NULL;
  if (lua_getfield(L, LUA_REGISTRYINDEX, "luv_context") == LUA_TUSERDATA &&
      lua_rawlen(L, -1) >= sizeof(ah_luv_ctx))
    ctx = (ah_luv_ctx *)lua_touserdata(L, -1);
  lua_pushboolean(L, ctx && ctx->cb_pcall == ah_luv_cb_pcall);
  return 1;
}

static const luaL_Reg luv_funcs[] = {
  {"luv_wrap", l_luv_wrap},
  {"luv_wrap_run", l_luv_wrap_run},
  {"luv_attach", l_luv_attach},
  {"luv_detach", l_luv_detach},
  {"luv_attached", l_luv_attached},
  {"luv_flags", l_luv_flags},
  {NULL, NULL}
};

void ah_luv_stats(lua_State *L) {
  ah_luv *lv = ah_luv_push(L);
  lua_Integer fast = lv ? lv->fast_callbacks : 0;
  lua_pop(L, 1);
  lua_pushinteger(L, fast);
  lua_setfield(L, -2, "fast_callbacks");
}

/* module table on top: the luv functions; anchors.c asks ah_luv_resource
** for the lazily made resource of a running callback */
void ah_open_luv(lua_State *L) {
  ah_st(L)->lazy_resource = ah_luv_resource;
  ah_st(L)->sync_frame = ah_luv_sync_frame;
  ah_add_funcs(L, luv_funcs);
  lua_pushinteger(L, (lua_Integer)sizeof(ah_rec)); /* for the specs */
  lua_setfield(L, -2, "luv_record_size");
}
