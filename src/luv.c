/*
** luv.c - luv callbacks run in the context of their registration.
**
** Three pieces:
**  - registration wrappers (`wrapped`): a C closure that stands in for a
**    callback-taking luv function.  It finds the callback argument, and when
**    something could observe it (a hook enabled, a non-empty frame, or
**    executionAsyncResource() ever called) hands luv a *record* instead: a
**    small userdata with named fields (asyncId, triggerAsyncId, what the
**    resource needs) and user values (callback, frame, resource or handle).
**    luv's own C function is then called directly, in the wrapper's frame,
**    with exactly the caller's arguments: its argument errors read as they
**    do without the library and no protected call is needed.  A handle whose
**    callback slot is re-armed from inside that very callback (timer and
**    idle chains, read_start) gets its record back, updated in place.
**    Otherwise the user's callback goes to luv untouched.
**  - a replacement for luv's cb_pcall (`ah_cb_pcall`), the function luv
**    calls every Lua callback through.  It runs every callback, tracked or
**    not, in its own context (a record's, or the root context: asyncId 0,
**    empty frame) and restores the caller's context afterwards, also when
**    the callback raised (luv's own handler has printed the error, with its
**    traceback, by then).  On the main thread, where luv runs callbacks,
**    this is done inline in C: luv calls the user's function itself (no
**    extra frame in tracebacks) and nothing allocates once the context is
**    switched.  Other threads, and the rare cases that need memory (a
**    resource made lazily), go through protected enter/leave closures.
**  - the record's __call, used only when luv calls a record without the
**    library's cb_pcall in front (after uninstall()).
**
** Handle registrations are destroyed when the same callback slot (the same
** start function) is re-armed on the handle, or when the handle is closed;
** requests made on a handle (write, shutdown, udp_send, ...) are separate
** one-shot resources.  To deliver those destroys, records of handles are
** kept in a map (handle -> record, or handle -> {slot -> record}) while
** destroy hooks exist.
**
** luv's context (registry["luv_context"]) is reached without linking luv or
** libuv: only its first three fields are used, which have kept their layout
** since luv 1.30.
*/
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core.h"

typedef int (*ah_luv_pcall)(lua_State *L, int nargs, int nresults, int flags);

typedef struct ah_luv_ctx { /* prefix of luv_ctx_t */
  void *loop;
  lua_State *L;
  ah_luv_pcall cb_pcall;
} ah_luv_ctx;

struct ah_rec;

/* registry[&luv_key]: one per Lua state, never collected before it */
typedef struct ah_luv {
  ah_luv_ctx *ctx;    /* NULL until attached */
  ah_luv_pcall orig;  /* luv's own cb_pcall */
  ah_state *st;
  const void *rec_mt; /* metatable of records */
  struct ah_rec *cur; /* record whose callback runs (inline path), or NULL */
  int flags; /* or'ed into luv's flags (tests: 1 = no exit, 4 = no message) */
} ah_luv;

/* user values of the ah_luv userdata */
enum {
  LV_ENTER = 1, /* protected enter closure (the slow path) */
  LV_LEAVE,     /* protected leave closure */
  LV_FLUSH,     /* protected destroy flush */
  LV_EMIT,      /* protected emit(kind, id) */
  LV_F, LV_R, LV_AUX, LV_EMPTY, /* shared values, for the inline path */
  LV_CUR,       /* the record lv->cur points to (anchor, and to push it) */
  LV_MAP,       /* handle -> record | {slot -> record} (weak keys) */
  LV_RECMT,     /* metatable of records */
  LV_SPECS,     /* original function -> spec (keeps specs alive) */
  LV_NUV = LV_SPECS
};

static const char luv_key = 0;

/* kinds of wrapped functions */
enum { W_HANDLE = 0, W_CREATE, W_CLOSE, W_REQ, W_WORK };

/* One per wrapped luv function, anchored in LV_SPECS for the life of the
** state (records point to it).  User values: the op name (the luv
** function's name), the resource type (nil: the handle's type). */
typedef struct ah_spec {
  lua_CFunction orig;
  int kind;
  int pos, alt; /* callback position; alternative when pos is nil/absent */
  int slot;     /* callback slot of handle registrations (1-based) */
  int fn;       /* luv accepts only a function there: a record closure */
} ah_spec;
enum { SP_OP = 1, SP_TYPE, SP_NUV = SP_TYPE };

/* A registration.  User values: the callback, the frame, the resource
** table (REC_RES set) or else the handle (or nil). */
typedef struct ah_rec {
  lua_Integer id, trigger;
  const ah_spec *spec;
  const void *handle; /* identity of the handle, for re-arming */
  unsigned char flags;
} ah_rec;
enum { RV_CB = 1, RV_FRAME, RV_RES, RV_N = RV_RES };
enum { REC_ONESHOT = 1, REC_RES = 2, REC_MAPPED = 4 };

/* wrapper upvalues, after the shared ones */
#define W_SPEC lua_upvalueindex(AH_NUP + 1)
#define W_LV lua_upvalueindex(AH_NUP + 2)
#define W_NUP (AH_NUP + 2)

/* ------------------------------------------------------------------- */
/* native stack of entered records                                      */

static int cb_push(ah_state *st, lua_Integer id) {
  if (st->cb_n == st->cb_cap) {
    size_t ncap = st->cb_cap * 2;
    lua_Integer *n;
    if (st->cb == st->cb_inline) {
      n = malloc(ncap * sizeof *n);
      if (n) memcpy(n, st->cb_inline, sizeof st->cb_inline);
    } else {
      n = realloc(st->cb, ncap * sizeof *n);
    }
    if (!n) return 0;
    st->cb = n;
    st->cb_cap = ncap;
  }
  st->cb[st->cb_n++] = id;
  return 1;
}

static void cb_pop(ah_state *st) {
  st->cb_n--;
  if (st->cb != st->cb_inline && st->cb_n <= AH_CB_INLINE / 2) {
    memcpy(st->cb_inline, st->cb, st->cb_n * sizeof *st->cb);
    free(st->cb);
    st->cb = st->cb_inline;
    st->cb_cap = AH_CB_INLINE;
  }
}

/* `after` for every record entered above depth (an error unwound them) */
static void cb_unwind(lua_State *L, ah_state *st, size_t depth) {
  while (st->cb_n > depth) {
    ah_emit_id(L, st, AH_AFTER, st->cb[st->cb_n - 1]);
    cb_pop(st);
    st->active--;
  }
}

/* ------------------------------------------------------------------- */
/* records                                                               */

static int rec_call(lua_State *L);

/* The record as a function, for the luv functions that accept nothing
** else (new_async, new_work): a closure with the record as last upvalue. */
#define RF_REC lua_upvalueindex(AH_NUP + 1)
static int rec_fn(lua_State *L) {
  lua_pushvalue(L, RF_REC);
  lua_insert(L, 1);
  return rec_call(L);
}

/* the record at idx, or NULL (a cheap test: its metatable); a record
** closure at idx is replaced by its record */
static ah_rec *as_record(lua_State *L, const ah_luv *lv, int idx) {
  const void *mt;
  int t = lua_type(L, idx);
  if (t == LUA_TFUNCTION && lua_tocfunction(L, idx) == rec_fn) {
    lua_getupvalue(L, idx, AH_NUP + 1);
    lua_replace(L, idx);
  } else if (t != LUA_TUSERDATA) {
    return NULL;
  }
  if (!lua_getmetatable(L, idx)) return NULL;
  mt = lua_topointer(L, -1);
  lua_pop(L, 1);
  return mt == lv->rec_mt ? (ah_rec *)lua_touserdata(L, idx) : NULL;
}

/* push a new resource table for the record being made: {handle = h} */
static void push_resource(lua_State *L, int handle_idx) {
  lua_createtable(L, 0, 2);
  if (handle_idx) {
    lua_pushvalue(L, handle_idx);
    lua_setfield(L, -2, "handle");
  }
}

/* the record at idx gets its resource now (executionAsyncResource() was
** called after it was registered); allocates */
static void rec_materialize(lua_State *L, ah_rec *r, int idx) {
  idx = lua_absindex(L, idx);
  lua_getiuservalue(L, idx, RV_RES); /* the handle, or nil */
  push_resource(L, lua_isnil(L, -1) ? 0 : lua_gettop(L));
  lua_setiuservalue(L, idx, RV_RES);
  lua_pop(L, 1);
  r->flags |= REC_RES;
}

/* push the record's resource, or nil */
static void rec_push_resource(lua_State *L, const ah_rec *r, int idx) {
  if (r->flags & REC_RES)
    lua_getiuservalue(L, idx, RV_RES);
  else
    lua_pushnil(L);
}

/* ------------------------------------------------------------------- */
/* the map of handle registrations (kept while destroy hooks exist)      */

/* push the record of (handle at h, slot), or nil */
static void map_get(lua_State *L, int map, int h, int slot) {
  lua_pushvalue(L, h);
  if (lua_rawget(L, map) == LUA_TTABLE) {
    lua_rawgeti(L, -1, slot);
    lua_remove(L, -2);
  } else if (lua_type(L, -1) == LUA_TUSERDATA &&
             ((ah_rec *)lua_touserdata(L, -1))->spec->slot != slot) {
    lua_pop(L, 1);
    lua_pushnil(L);
  }
}

/* make the key of (h, slot) exist, so that map_set cannot fail; allocates */
static void map_reserve(lua_State *L, ah_state *st, int map, int h, int slot) {
  int t;
  lua_pushvalue(L, h);
  t = lua_rawget(L, map);
  if (t == LUA_TNIL) {
    lua_pushvalue(L, h);
    lua_pushboolean(L, 0);
    lua_rawset(L, map);
    st->handles++;
  } else if (t == LUA_TTABLE) {
    if (lua_rawgeti(L, -1, slot) == LUA_TNIL) {
      lua_pushboolean(L, 0);
      lua_rawseti(L, -3, slot);
    }
    lua_pop(L, 1);
  } else if (t == LUA_TUSERDATA) {
    int other = ((ah_rec *)lua_touserdata(L, -1))->spec->slot;
    if (other != slot) { /* a second slot: {slot -> record} */
      lua_createtable(L, 0, 2);
      lua_pushvalue(L, -2);
      lua_rawseti(L, -2, other);
      lua_pushboolean(L, 0);
      lua_rawseti(L, -2, slot);
      lua_pushvalue(L, h);
      lua_insert(L, -2);
      lua_rawset(L, map);
    }
  }
  lua_pop(L, 1);
}

/* (h, slot) -> the record at rec; the key was reserved */
static void map_set(lua_State *L, int map, int h, int slot, int rec) {
  lua_pushvalue(L, h);
  if (lua_rawget(L, map) == LUA_TTABLE) {
    lua_pushvalue(L, rec);
    lua_rawseti(L, -2, slot);
  } else {
    lua_pushvalue(L, h);
    lua_pushvalue(L, rec);
    lua_rawset(L, map);
  }
  lua_pop(L, 1);
  ((ah_rec *)lua_touserdata(L, rec))->flags |= REC_MAPPED;
}

/* the registration at the top ends: its destroy; pops it */
static void map_forget(lua_State *L, ah_state *st) {
  ah_rec *r = (ah_rec *)lua_touserdata(L, -1);
  if (r && (r->flags & REC_MAPPED)) {
    r->flags &= (unsigned char)~REC_MAPPED;
    if (st->nhooks[AH_DESTROY]) ah_queue_destroy(st, r->id);
  }
  lua_pop(L, 1);
}

/* the registration of (h, slot) ends (slot 0: every slot of h, the handle
** is closing); never allocates */
static void map_drop(lua_State *L, ah_state *st, int map, int h, int slot) {
  lua_pushvalue(L, h);
  switch (lua_rawget(L, map)) {
    case LUA_TTABLE:
      if (slot) {
        lua_rawgeti(L, -1, slot);
        map_forget(L, st);
        lua_pushnil(L);
        lua_rawseti(L, -2, slot);
        lua_pop(L, 1);
        return;
      }
      lua_pushnil(L);
      while (lua_next(L, -2)) map_forget(L, st);
      break;
    case LUA_TUSERDATA:
      if (slot && ((ah_rec *)lua_touserdata(L, -1))->spec->slot != slot) {
        lua_pop(L, 1);
        return;
      }
      lua_pushvalue(L, -1);
      map_forget(L, st);
      break;
    case LUA_TNIL:
      lua_pop(L, 1);
      return;
    default: break;
  }
  lua_pop(L, 1);
  lua_pushvalue(L, h);
  lua_pushnil(L);
  lua_rawset(L, map);
  if (st->handles > 0) st->handles--;
}

/* ------------------------------------------------------------------- */
/* registration wrappers                                                 */

static int observable(ah_state *st, int s) {
  return st->nhooks[AH_INIT] || st->nhooks[AH_BEFORE] || st->nhooks[AH_AFTER] ||
         st->nhooks[AH_DESTROY] || st->res_on || (st->slots[s].anchored & A_FRAME);
}

/* the position of the callback argument, or 0 (a synchronous call) */
static int find_callback(lua_State *L, const ah_spec *sp, int n) {
  if (sp->pos <= n && ah_callable(L, sp->pos)) return sp->pos;
  if (sp->alt && sp->alt <= n && ah_callable(L, sp->alt) &&
      (sp->pos > n || lua_isnil(L, sp->pos)))
    return sp->alt;
  return 0;
}

/* The resource type for init: the spec's, else the handle's __name. */
static void push_type(lua_State *L, int handle_idx) {
  if (lua_getiuservalue(L, W_SPEC, SP_TYPE) == LUA_TSTRING) return;
  lua_pop(L, 1);
  if (!handle_idx || luaL_getmetafield(L, handle_idx, "__name") != LUA_TSTRING)
    lua_pushliteral(L, "uv_handle");
}

/* everything after luv accepted the registration: nothing below fails
** before init is emitted (hooks errors end the process) */
static void registered(lua_State *L, ah_state *st, ah_rec *r, int rec,
                       int handle_idx) {
  if (st->nhooks[AH_INIT]) {
    if (rec) rec_push_resource(L, r, rec); else lua_pushnil(L);
    push_type(L, handle_idx);
    ah_emit_init(L, st, r->id, lua_tostring(L, -1), r->trigger, -2);
    lua_pop(L, 2);
  }
}

/* fill the new record at the top for the callback at pos, context of slot s */
static ah_rec *new_record(lua_State *L, ah_state *st, const ah_spec *sp,
                          int pos, int s, int handle_idx) {
  ah_rec *r = (ah_rec *)lua_newuserdatauv(L, sizeof(ah_rec), RV_N);
  int rec = lua_gettop(L);
  r->id = 0;
  r->trigger = st->slots[s].id;
  r->spec = sp;
  r->handle = handle_idx ? lua_topointer(L, handle_idx) : NULL;
  r->flags = (sp->kind == W_CLOSE || sp->kind == W_REQ) ? REC_ONESHOT : 0;
  lua_getiuservalue(L, W_LV, LV_RECMT);
  lua_setmetatable(L, rec);
  lua_pushvalue(L, pos);
  lua_setiuservalue(L, rec, RV_CB);
  lua_rawgeti(L, AH_UV_F, s);
  lua_setiuservalue(L, rec, RV_FRAME);
  if (st->nhooks[AH_INIT] || st->res_on || sp->kind == W_CREATE) {
    push_resource(L, handle_idx);
    if (sp->kind == W_CREATE) { /* the handle comes later: make the key */
      lua_pushboolean(L, 0);
      lua_setfield(L, -2, "handle");
    }
    r->flags |= REC_RES;
  } else if (handle_idx) {
    lua_pushvalue(L, handle_idx);
  } else {
    lua_pushnil(L);
  }
  lua_setiuservalue(L, rec, RV_RES);
  return r;
}

/* A handle whose callback runs re-arms the same slot: its record is
** updated in place once luv accepted it.  Stack: the n arguments; luv's
** start functions ignore values after their callback, which carry the new
** callback, the resource (or nil) and the map (destroy hooks only). */
static int rearm(lua_State *L, ah_state *st, ah_luv *lv, const ah_spec *sp,
                 int n, int pos) {
  ah_rec *r = lv->cur;
  int s = ah_slot_of(L, st), nres, destroy = st->nhooks[AH_DESTROY] != 0;
  int res = st->nhooks[AH_INIT] || st->res_on;
  lua_Integer id, old;
  luaL_checkstack(L, 8, "async_hooks");
  lua_pushvalue(L, pos); /* n+1 */
  if (res) push_resource(L, 1); else lua_pushnil(L); /* n+2 */
  if (destroy) { /* n+3 */
    lua_getiuservalue(L, W_LV, LV_MAP);
    if (!(r->flags & REC_MAPPED)) map_reserve(L, st, n + 3, 1, sp->slot);
  }
  lua_getiuservalue(L, W_LV, LV_CUR);
  lua_replace(L, pos);
  id = st->next_id++;
  nres = sp->orig(L);
  /* accepted: the old registration ends, the new one begins */
  old = r->id;
  r->id = id;
  r->trigger = st->slots[s].id;
  lua_pushvalue(L, n + 1);
  lua_setiuservalue(L, pos, RV_CB);
  lua_rawgeti(L, AH_UV_F, s);
  lua_setiuservalue(L, pos, RV_FRAME);
  if (res || (r->flags & REC_RES)) {
    if (res) lua_pushvalue(L, n + 2); else lua_pushvalue(L, 1);
    lua_setiuservalue(L, pos, RV_RES);
    r->flags = (unsigned char)(res ? r->flags | REC_RES : r->flags & ~REC_RES);
  }
  if (r->flags & REC_MAPPED) {
    if (destroy) ah_queue_destroy(st, old);
  } else if (destroy) {
    map_set(L, n + 3, 1, sp->slot, pos);
  }
  registered(L, st, r, pos, 1);
  return nres;
}

/* after luv made the handle (new_async, spawn): it becomes the resource's */
static void created(lua_State *L, ah_state *st, ah_rec *r, int rec, int handle,
                    int map) {
  r->handle = lua_topointer(L, handle);
  lua_getiuservalue(L, rec, RV_RES);
  lua_pushvalue(L, handle);
  lua_setfield(L, -2, "handle"); /* the key exists */
  lua_pop(L, 1);
  if (st->nhooks[AH_DESTROY]) { /* can fail: luv has the handle already */
    map_reserve(L, st, map, handle, r->spec->slot);
    map_set(L, map, handle, r->spec->slot, rec);
  }
}

/* a new record takes the callback's place; stack: the n arguments */
static int track(lua_State *L, ah_state *st, const ah_spec *sp, int n,
                 int pos) {
  int s = ah_slot_of(L, st), nres, map;
  int handle_idx = sp->kind != W_CREATE && sp->kind != W_WORK &&
                   lua_type(L, 1) == LUA_TUSERDATA ? 1 : 0;
  int keep = sp->kind == W_HANDLE && handle_idx;
  ah_rec *r;
  luaL_checkstack(L, 12, "async_hooks");
  /* everything that can fail, before luv sees anything */
  lua_getiuservalue(L, W_LV, LV_MAP); /* n+1 */
  if (keep && st->nhooks[AH_DESTROY]) map_reserve(L, st, n + 1, 1, sp->slot);
  r = new_record(L, st, sp, pos, s, handle_idx); /* n+2 */
  if (sp->fn) {
    ah_push_shared(L);
    lua_pushvalue(L, n + 2);
    lua_pushcclosure(L, rec_fn, AH_NUP + 1);
  }
  lua_replace(L, pos);
  lua_settop(L, n);
  r->id = st->next_id++;
  /* luv's function, in our frame, with exactly the caller's arguments */
  nres = sp->orig(L);
  lua_getiuservalue(L, W_LV, LV_MAP);
  map = lua_gettop(L);
  if (sp->fn) lua_getupvalue(L, pos, AH_NUP + 1); else lua_pushvalue(L, pos);
  if (lua_touserdata(L, -1) != (void *)r) { /* luv moved its arguments */
    registered(L, st, r, 0, 0);
    lua_pop(L, 2);
    return nres;
  }
  pos = lua_gettop(L); /* the record */
  if (sp->kind == W_CLOSE && st->handles) {
    map_drop(L, st, map, 1, 0);
  } else if (keep && st->nhooks[AH_DESTROY]) {
    map_get(L, map, 1, sp->slot);
    map_forget(L, st); /* the registration it replaces */
    map_set(L, map, 1, sp->slot, pos);
  } else if (keep && st->handles) {
    map_drop(L, st, map, 1, sp->slot);
  }
  if (sp->kind == W_CREATE && nres > 0 && lua_type(L, map - nres) == LUA_TUSERDATA) {
    created(L, st, r, pos, map - nres, map);
    registered(L, st, r, pos, map - nres);
  } else {
    registered(L, st, r, pos, handle_idx);
  }
  lua_pop(L, 2);
  return nres;
}

static int wrapped(lua_State *L) {
  ah_state *st = ah_st(L);
  const ah_spec *sp = (const ah_spec *)lua_touserdata(L, W_SPEC);
  int n = lua_gettop(L), pos = find_callback(L, sp, n), nres;
  if (pos && observable(st, ah_slot_of(L, st))) {
    ah_luv *lv = (ah_luv *)lua_touserdata(L, W_LV);
    if (sp->kind == W_HANDLE && lv->cur && lv->cur->spec->slot == sp->slot &&
        lv->cur->handle == lua_topointer(L, 1) && lv->cur->handle)
      return rearm(L, st, lv, sp, n, pos);
    return track(L, st, sp, n, pos);
  }
  if (!st->handles || !(sp->kind == W_CLOSE || (pos && sp->kind == W_HANDLE)))
    return sp->orig(L); /* the common case: luv's function, nothing else */
  /* a tracked registration of the handle ends: closed, or replaced by an
  ** untracked callback */
  nres = sp->orig(L);
  luaL_checkstack(L, 8, "async_hooks");
  lua_getiuservalue(L, W_LV, LV_MAP);
  map_drop(L, st, lua_gettop(L), 1, sp->kind == W_CLOSE ? 0 : sp->slot);
  lua_pop(L, 1);
  return nres;
}

static ah_luv *luv_state(lua_State *L);

/* luv_wrap(orig, op, pos, alt, kind, type|nil, slot, fn) -> wrapper */
static int l_luv_wrap(lua_State *L) {
  lua_CFunction f = lua_tocfunction(L, 1);
  lua_Integer pos = luaL_checkinteger(L, 3), alt = luaL_optinteger(L, 4, 0);
  lua_Integer kind = luaL_checkinteger(L, 5), slot = luaL_optinteger(L, 7, 0);
  ah_spec *sp;
  int sp_fn;
  luaL_argexpected(L, f != NULL && lua_getupvalue(L, 1, 1) == NULL, 1,
                   "C function without upvalues");
  luaL_checktype(L, 2, LUA_TSTRING);
  luaL_argcheck(L, pos > 0 && pos < 16 && alt >= 0 && alt < 16, 3, "bad position");
  luaL_argcheck(L, kind >= W_HANDLE && kind <= W_WORK, 5, "bad kind");
  if (!lua_isnil(L, 6)) luaL_checktype(L, 6, LUA_TSTRING);
  sp_fn = lua_toboolean(L, 8);
  lua_settop(L, 7);
  luv_state(L); /* 8 */
  lua_getiuservalue(L, 8, LV_SPECS); /* 9 */
  sp = (ah_spec *)lua_newuserdatauv(L, sizeof(ah_spec), SP_NUV); /* 10 */
  sp->orig = f;
  sp->kind = (int)kind;
  sp->pos = (int)pos;
  sp->alt = (int)alt;
  sp->slot = (int)slot;
  sp->fn = sp_fn;
  lua_pushvalue(L, 2);
  lua_setiuservalue(L, 10, SP_OP);
  lua_pushvalue(L, 6);
  lua_setiuservalue(L, 10, SP_TYPE);
  lua_pushvalue(L, 10);
  lua_rawsetp(L, 9, sp); /* anchored for the life of the state */
  ah_push_shared(L);
  lua_pushvalue(L, 10);
  lua_pushvalue(L, 8);
  lua_pushcclosure(L, wrapped, W_NUP);
  return 1;
}


/* ------------------------------------------------------------------- */
/* the record's __call (luv calls it without our cb_pcall in front)      */

/* enter the record's context, call its callback with luv's arguments,
** restore; called protected so that the context is restored on error */
static int rec_call(lua_State *L) {
  ah_state *st = ah_st(L);
  ah_rec *r = (ah_rec *)lua_touserdata(L, 1);
  int n = lua_gettop(L), s = ah_slot_of(L, st), i, status;
  lua_Integer id = r->id, pid = st->slots[s].id, ptrig = st->slots[s].trigger;
  int oneshot = r->flags & REC_ONESHOT;
  luaL_checkstack(L, n + 24, "async_hooks");
  if (!(r->flags & REC_RES) && st->res_on) rec_materialize(L, r, 1);
  ah_reserve(L, s);
  lua_rawgeti(L, AH_UV_R, s); /* n+1: previous resource */
  lua_rawgeti(L, AH_UV_F, s); /* n+2: previous frame */
  rec_push_resource(L, r, 1); /* n+3 */
  lua_getiuservalue(L, 1, RV_FRAME); /* n+4 */
  if (!cb_push(st, id)) return luaL_error(L, "not enough memory");
  st->slots[s].id = id;
  st->slots[s].trigger = r->trigger;
  ah_set_resource(L, s, n + 3);
  ah_set_frame(L, s, n + 4);
  st->active++;
  ah_emit_id(L, st, AH_BEFORE, id);
  lua_getiuservalue(L, 1, RV_CB);
  for (i = 2; i <= n; i++) lua_pushvalue(L, i);
  status = lua_pcall(L, n - 1, 0, 0);
  cb_unwind(L, st, st->cb_n - 1);
  s = ah_slot_of(L, st);
  st->slots[s].id = pid;
  st->slots[s].trigger = ptrig;
  ah_set_resource(L, s, n + 1);
  ah_set_frame(L, s, n + 2);
  if (oneshot && st->nhooks[AH_DESTROY]) ah_queue_destroy(st, id);
  ah_flush_maybe(L, st);
  if (status != LUA_OK) return lua_error(L); /* the error object is on top */
  return 0;
}

/* ------------------------------------------------------------------- */
/* the cb_pcall replacement                                              */

/* Switch the main thread's frame (at fi) and resource (at ri, 0: none);
** F at Fi, R and AUX from the ah_luv at lvi.  The main thread's anchors
** are aux slots and its F/R keys exist from the start (see stack.c), so
** this never allocates. */
static void main_switch(lua_State *L, ah_state *st, int s, int lvi, int Fi,
                        int fi, int ri) {
  ah_slot *sl = &st->slots[s];
  int res = ri && lua_toboolean(L, ri), had_res = sl->anchored & A_RES;
  lua_getiuservalue(L, lvi, LV_AUX);
  if (lua_topointer(L, fi) != st->empty) {
    lua_pushvalue(L, fi);
    lua_rawseti(L, -2, AUX_MAINFRAME);
    sl->anchored |= A_FRAME | K_FRAME;
  } else if (sl->anchored & A_FRAME) {
    lua_pushboolean(L, 0);
    lua_rawseti(L, -2, AUX_MAINFRAME);
    sl->anchored &= ~A_FRAME;
  }
  if (res || had_res) {
    if (res) lua_pushvalue(L, ri); else lua_pushboolean(L, 0);
    lua_rawseti(L, -2, AUX_MAINRES);
    if (res) sl->anchored |= A_RES | K_RES; else sl->anchored &= ~A_RES;
    lua_getiuservalue(L, lvi, LV_R);
    if (res) lua_pushvalue(L, ri); else lua_pushboolean(L, 0);
    lua_rawseti(L, -2, s);
    lua_pop(L, 1);
  }
  lua_pushvalue(L, fi);
  lua_rawseti(L, Fi, s);
  lua_pop(L, 1);
}

/* call the closure in user value uv of the ah_luv at lvi with the n values
** on top; 0 if it could not run (out of memory) */
static int protected(lua_State *L, int lvi, int uv, int n, int nres) {
  lua_getiuservalue(L, lvi, uv);
  lua_insert(L, -1 - n);
  if (lua_pcall(L, n, nres, 0) == LUA_OK) return 1;
  lua_pop(L, 1);
  return 0;
}

/* a hook event from the inline path: a hook that fails, or no memory to
** call the hooks, ends the process (as any hook error does) */
static void emit(lua_State *L, int lvi, int kind, lua_Integer id) {
  lua_pushinteger(L, kind);
  lua_pushinteger(L, id);
  if (!protected(L, lvi, LV_EMIT, 2, 0)) {
    fprintf(stderr, "async_hooks: error in %s hook (fatal): not enough memory\n",
            kind == AH_BEFORE ? "before" : "after");
    fflush(stderr);
    exit(1);
  }
}

/* the value at idx is not F[s] (F at Fi) */
static int frame_differs(lua_State *L, int Fi, int s, int idx) {
  const void *p;
  lua_rawgeti(L, Fi, s);
  p = lua_topointer(L, -1);
  lua_pop(L, 1);
  return p != lua_topointer(L, idx);
}

/* Inline dispatch on the main thread: no Lua call unless a hook must be
** emitted or destroys are due.  The stack is [X args lv] with X the
** record r (or a plain callback when r is NULL); while the callback runs
** it is [X lv F prev_frame prev_res fn args]. */
enum { D_LV = 1, D_F, D_PFRAME, D_PRES, D_NSAVED = D_PRES };
static int dispatch_inline(lua_State *L, ah_luv *lv, ah_state *st, int s,
                           ah_rec *r, int nargs, int nresults, int flags) {
  int base = lua_gettop(L) - nargs - 1, ret, top;
  int lvi = base + D_LV, Fi = base + D_F, pfi = base + D_PFRAME, pri = base + D_PRES;
  lua_Integer pid = st->slots[s].id, ptrig = st->slots[s].trigger;
  lua_Integer id = r ? r->id : 0;
  size_t depth = st->cb_n - (r != NULL); /* the caller pushed r's entry */
  int oneshot = r && (r->flags & REC_ONESHOT);
  int pres = st->slots[s].anchored & A_RES, res = r && (r->flags & REC_RES);
  /* [X args lv] -> [X lv F pframe pres fn args] */
  lua_getiuservalue(L, -1, LV_F);
  lua_rawgeti(L, -1, s);
  if (pres) {
    lua_getiuservalue(L, -3, LV_R);
    lua_rawgeti(L, -1, s);
    lua_replace(L, -2);
  } else {
    lua_pushboolean(L, 0);
  }
  if (r) lua_getiuservalue(L, base, RV_CB); else lua_pushvalue(L, base);
  lua_rotate(L, base + 1, D_NSAVED + 1);
  /* switch (nothing below allocates) */
  if (r) {
    lua_getiuservalue(L, base, RV_FRAME);
    if (res) lua_getiuservalue(L, base, RV_RES);
    st->slots[s].trigger = r->trigger;
  } else {
    lua_getiuservalue(L, lvi, LV_EMPTY);
    st->slots[s].trigger = 0;
  }
  st->slots[s].id = id;
  top = lua_gettop(L);
  if (res || pres || lua_topointer(L, top - res) != lua_topointer(L, pfi))
    main_switch(L, st, s, lvi, Fi, top - res, res ? top : 0);
  lua_settop(L, base + D_NSAVED + nargs + 1);
  st->active += r ? 2 : 1; /* the callback, and its entry in st->cb */
  if (r) {
    lv->cur = r;
    lua_pushvalue(L, base);
    lua_setiuservalue(L, lvi, LV_CUR);
    if (st->nhooks[AH_BEFORE]) emit(L, lvi, AH_BEFORE, id);
  } else {
    lv->cur = NULL;
  }
  ret = lv->orig(L, nargs, nresults, flags);
  /* leave */
  if (r) {
    lua_pushnil(L);
    lua_setiuservalue(L, lvi, LV_CUR);
  }
  lv->cur = NULL;
  if (st->cb_n != depth + (r != NULL)) { /* an error unwound records */
    lua_pushvalue(L, pri);
    lua_pushvalue(L, pfi);
    lua_pushinteger(L, pid);
    lua_pushinteger(L, ptrig);
    lua_pushinteger(L, (lua_Integer)depth);
    lua_pushvalue(L, base);
    if (protected(L, lvi, LV_LEAVE, 6, 0)) goto done;
    while (st->cb_n > depth) { cb_pop(st); st->active--; } /* no memory */
  } else if (r) {
    if (st->nhooks[AH_AFTER]) emit(L, lvi, AH_AFTER, id);
    cb_pop(st);
    st->active--;
  }
  if (oneshot && st->nhooks[AH_DESTROY]) ah_queue_destroy(st, id);
  st->slots[s].id = pid;
  st->slots[s].trigger = ptrig;
  if (pres || (st->slots[s].anchored & A_RES) || frame_differs(L, Fi, s, pfi))
    main_switch(L, st, s, lvi, Fi, pfi, pres ? pri : 0);
  st->active--;
  if (st->dq_n && !st->active && !st->dispatching)
    protected(L, lvi, LV_FLUSH, 0, 0);
done:
  if (nresults == 0) {
    lua_settop(L, base - 1);
  } else { /* [X lv F pframe pres results] -> [results] */
    lua_rotate(L, base, -(D_NSAVED + 1));
    lua_pop(L, D_NSAVED + 1);
  }
  return ret;
}

/* The slow path's enter(X): save the current thread's context and enter
** the callback's: the record's (its before is emitted here), or else the
** root context.  Returns previous resource, frame, id, trigger, depth of
** st->cb, and the function luv must call.  Everything that can fail comes
** first: nothing has changed if it does. */
#define E_LV lua_upvalueindex(AH_NUP + 1)
static int luv_enter(lua_State *L) {
  ah_state *st = ah_st(L);
  ah_luv *lv = (ah_luv *)lua_touserdata(L, E_LV);
  ah_rec *r = as_record(L, lv, 1);
  int s = ah_slot_of(L, st);
  luaL_checkstack(L, 24, "async_hooks");
  lua_settop(L, 1);
  ah_reserve(L, s);
  if (r && !(r->flags & REC_RES) && st->res_on) rec_materialize(L, r, 1);
  lua_rawgeti(L, AH_UV_R, s);
  lua_rawgeti(L, AH_UV_F, s);
  lua_pushinteger(L, st->slots[s].id);
  lua_pushinteger(L, st->slots[s].trigger);
  lua_pushinteger(L, (lua_Integer)st->cb_n);
  if (r) {
    rec_push_resource(L, r, 1);        /* 7 */
    lua_getiuservalue(L, 1, RV_FRAME); /* 8 */
    lua_getiuservalue(L, 1, RV_CB);    /* 9 */
    if (!cb_push(st, r->id)) return luaL_error(L, "not enough memory");
    /* switch (hook errors end the process) */
    st->active += 2;
    st->slots[s].id = r->id;
    st->slots[s].trigger = r->trigger;
    ah_set_resource(L, s, 7);
    ah_set_frame(L, s, 8);
    lua_replace(L, 7);
    lua_settop(L, 7);
    lv->cur = r;
    lua_pushvalue(L, 1);
    lua_setiuservalue(L, E_LV, LV_CUR);
    ah_emit_id(L, st, AH_BEFORE, r->id);
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
    lv->cur = NULL;
  }
  return 6;
}

/* leave(res, frame, id, trigger, depth, X): `after` for the callback's
** record and any that an error unwound, its destroy when one-shot,
** restore, flush.  Allocates nothing (hook errors end the process). */
static int luv_leave(lua_State *L) {
  ah_state *st = ah_st(L);
  ah_luv *lv = (ah_luv *)lua_touserdata(L, E_LV);
  ah_rec *r = as_record(L, lv, 6);
  int s;
  lv->cur = NULL;
  lua_pushnil(L);
  lua_setiuservalue(L, E_LV, LV_CUR);
  cb_unwind(L, st, (size_t)lua_tointeger(L, 5));
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
  ah_flush_maybe(L, st);
  return 0;
}

static int luv_emit(lua_State *L) {
  ah_emit_id(L, ah_st(L), (int)lua_tointeger(L, 1), lua_tointeger(L, 2));
  return 0;
}

static int luv_flush(lua_State *L) {
  ah_state *st = ah_st(L);
  ah_flush_maybe(L, st);
  return 0;
}

#define NSAVED 7 /* lv res frame id trigger depth X */

/* Anything the inline path does not do: through the enter/leave closures,
** called protected.  Stack: [X args lv]. */
static int dispatch_slow(lua_State *L, ah_luv *lv, int nargs, int nresults,
                         int flags) {
  int base = lua_gettop(L) - nargs - 1, ret, top;
  if (!lua_checkstack(L, 12)) { /* no memory: run it bare */
    lua_pop(L, 1);
    return lv->orig(L, nargs, nresults, flags);
  }
  lua_getiuservalue(L, -1, LV_ENTER);
  lua_pushvalue(L, base);
  if (lua_pcall(L, 1, 6, 0) != LUA_OK) { /* out of memory, nothing entered */
    lua_settop(L, base + nargs);         /* luv calls the record, */
    return lv->orig(L, nargs, nresults, flags); /* whose __call copes */
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
  if (lua_pcall(L, NSAVED - 1, 0, 0) != LUA_OK) lua_pop(L, 1); /* cannot happen */
  lua_rotate(L, base, top - base - NSAVED + 1); /* results below our values */
  lua_settop(L, top - NSAVED);
  return ret;
}

/* The common untracked case: a plain callback arriving while the thread's
** context is empty (uv.run at top level).  Only the ids are switched. */
static int dispatch_root(lua_State *L, ah_luv *lv, ah_state *st, int s,
                         int nargs, int nresults, int flags) {
  lua_Integer pid = st->slots[s].id, ptrig = st->slots[s].trigger;
  size_t depth = st->cb_n;
  int ret;
  lv->cur = NULL;
  st->slots[s].id = st->slots[s].trigger = 0;
  st->active++;
  ret = lv->orig(L, nargs, nresults, flags);
  lv->cur = NULL;
  if (!(st->slots[s].anchored & (A_FRAME | A_RES)) && st->cb_n == depth &&
      !(st->dq_n && st->active == 1 && !st->dispatching)) {
    st->fast_callbacks++;
    st->slots[s].id = pid;
    st->slots[s].trigger = ptrig;
    st->active--;
    return ret;
  }
  /* the callback set a value, or an error unwound records, or destroys
  ** are due: the full leave() */
  if (!lua_checkstack(L, 10)) { /* no memory: restore what C can */
    while (st->cb_n > depth) { cb_pop(st); st->active--; }
    st->slots[s].id = pid;
    st->slots[s].trigger = ptrig;
    st->active--;
    return ret;
  }
  lua_rawgetp(L, LUA_REGISTRYINDEX, &luv_key);
  lua_getiuservalue(L, -1, LV_LEAVE);
  lua_remove(L, -2);
  lua_pushnil(L);
  lua_pushnil(L); /* the empty frame */
  lua_pushinteger(L, pid);
  lua_pushinteger(L, ptrig);
  lua_pushinteger(L, (lua_Integer)depth);
  lua_pushnil(L);
  if (lua_pcall(L, 6, 0, 0) != LUA_OK) lua_pop(L, 1); /* cannot happen */
  return ret;
}

/* Every luv callback comes through here (see the top of the file). */
static int ah_cb_pcall(lua_State *L, int nargs, int nresults, int flags) {
  ah_luv *lv;
  ah_state *st;
  ah_rec *r;
  uintptr_t s;
  int base = lua_gettop(L) - nargs, known;
  lua_rawgetp(L, LUA_REGISTRYINDEX, &luv_key);
  lv = (ah_luv *)lua_touserdata(L, -1);
  st = lv->st;
  flags |= lv->flags;
  s = ah_extra(L);
  known = s < (uintptr_t)st->cap && st->slots[s].L == L;
  r = as_record(L, lv, base);
  if (!r && known && !(st->slots[s].anchored & (A_FRAME | A_RES))) {
    lua_pop(L, 1);
    return dispatch_root(L, lv, st, (int)s, nargs, nresults, flags);
  }
  if (known && L == st->mainL && lua_checkstack(L, 24) &&
      !(r && !(r->flags & REC_RES) && st->res_on) &&
      (!r || cb_push(st, r->id)))
    return dispatch_inline(L, lv, st, (int)s, r, nargs, nresults, flags);
  return dispatch_slow(L, lv, nargs, nresults, flags);
}

/* ------------------------------------------------------------------- */
/* set-up                                                                */

static void push_closure(lua_State *L, lua_CFunction f, int lvi) {
  ah_push_shared(L);
  if (lvi) lua_pushvalue(L, lvi);
  lua_pushcclosure(L, f, AH_NUP + (lvi != 0));
}

/* push the state's ah_luv, made the first time */
static ah_luv *luv_state(lua_State *L) {
  ah_luv *lv;
  int i;
  if (lua_rawgetp(L, LUA_REGISTRYINDEX, &luv_key) == LUA_TUSERDATA)
    return (ah_luv *)lua_touserdata(L, -1);
  lua_pop(L, 1);
  luaL_checkstack(L, AH_NUP + 6, "async_hooks");
  lv = (ah_luv *)lua_newuserdatauv(L, sizeof(ah_luv), LV_NUV);
  memset(lv, 0, sizeof *lv);
  lv->st = ah_st(L);
  i = lua_gettop(L);
  push_closure(L, luv_enter, i);
  lua_setiuservalue(L, i, LV_ENTER);
  push_closure(L, luv_leave, i);
  lua_setiuservalue(L, i, LV_LEAVE);
  push_closure(L, luv_flush, 0);
  lua_setiuservalue(L, i, LV_FLUSH);
  push_closure(L, luv_emit, 0);
  lua_setiuservalue(L, i, LV_EMIT);
  lua_pushvalue(L, AH_UV_F);
  lua_setiuservalue(L, i, LV_F);
  lua_pushvalue(L, AH_UV_R);
  lua_setiuservalue(L, i, LV_R);
  lua_pushvalue(L, AH_UV_AUX);
  lua_setiuservalue(L, i, LV_AUX);
  lua_rawgeti(L, AH_UV_AUX, AUX_EMPTY);
  lua_setiuservalue(L, i, LV_EMPTY);
  lua_newtable(L); /* the map: weak keys */
  lua_createtable(L, 0, 1);
  lua_pushliteral(L, "k");
  lua_setfield(L, -2, "__mode");
  lua_setmetatable(L, -2);
  lua_setiuservalue(L, i, LV_MAP);
  lua_createtable(L, 0, 2); /* records' metatable */
  lua_pushliteral(L, "async_hooks.luv_callback");
  lua_setfield(L, -2, "__name");
  push_closure(L, rec_call, 0);
  lua_setfield(L, -2, "__call");
  lv->rec_mt = lua_topointer(L, -1);
  lua_setiuservalue(L, i, LV_RECMT);
  lua_newtable(L);
  lua_setiuservalue(L, i, LV_SPECS);
  lua_pushvalue(L, i);
  lua_rawsetp(L, LUA_REGISTRYINDEX, &luv_key);
  return lv;
}

/* luv_attach(): take over luv's cb_pcall (idempotent) */
static int l_luv_attach(lua_State *L) {
  ah_luv *lv;
  ah_luv_ctx *ctx;
  if (lua_getfield(L, LUA_REGISTRYINDEX, "luv_context") != LUA_TUSERDATA)
    return luaL_error(L, "luv is not loaded in this Lua state");
  ctx = (ah_luv_ctx *)lua_touserdata(L, -1);
  lv = luv_state(L);
  if (ctx->cb_pcall == ah_cb_pcall) return 0;
  lv->ctx = ctx;
  lv->orig = ctx->cb_pcall;
  lv->cur = NULL;
  ctx->cb_pcall = ah_cb_pcall;
  return 0;
}

/* luv_detach(): give cb_pcall back */
static int l_luv_detach(lua_State *L) {
  ah_luv *lv;
  lua_rawgetp(L, LUA_REGISTRYINDEX, &luv_key);
  lv = (ah_luv *)lua_touserdata(L, -1);
  if (lv && lv->ctx && lv->ctx->cb_pcall == ah_cb_pcall) lv->ctx->cb_pcall = lv->orig;
  return 0;
}

/* luv_flags(n): LUVF_CALLBACK_* flags added to every callback (for tests
** that need a callback error not to end the process) */
static int l_luv_flags(lua_State *L) {
  ah_luv *lv;
  int flags = (int)luaL_checkinteger(L, 1);
  lua_rawgetp(L, LUA_REGISTRYINDEX, &luv_key);
  lv = (ah_luv *)lua_touserdata(L, -1);
  luaL_argcheck(L, lv != NULL && lv->ctx != NULL, 1, "luv integration not attached");
  lv->flags = flags;
  return 0;
}

static int l_luv_attached(lua_State *L) {
  ah_luv_ctx *ctx = NULL;
  if (lua_getfield(L, LUA_REGISTRYINDEX, "luv_context") == LUA_TUSERDATA)
    ctx = (ah_luv_ctx *)lua_touserdata(L, -1);
  lua_pushboolean(L, ctx && ctx->cb_pcall == ah_cb_pcall);
  return 1;
}

const luaL_Reg ah_luv_funcs[] = {
  {"luv_wrap", l_luv_wrap},
  {"luv_attach", l_luv_attach},
  {"luv_detach", l_luv_detach},
  {"luv_attached", l_luv_attached},
  {"luv_flags", l_luv_flags},
  {NULL, NULL}
};
