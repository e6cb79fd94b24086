/*
** floor.c - bench-only: the cheapest code that still does four operations
** of the library correctly, measured by bench/cg_case.lua (and the HTTP
** bench) the same way as the library (the floors of four issue-9 rows, see
** bench/README.md).
** Not part of the library; built by the bench (util.lua, build_floor) into
** build/bench/floor.so with the library's compiler flags.  It does not link
** liblua: the Lua API comes from the interpreter that loads it.
**
**  - get: a C get doing what a correct get must: the type check of self,
**    the state pointer (light userdata upvalue), the running thread's slot
**    from LUA_EXTRASPACE and the check that the slot is this thread's, then
**    the three lookups F[slot], self[1] (the token) and frame[token]
**    (default on nil).
**  - resume: lcorolib's resume (the same code) plus the state pointer, the
**    check that the coroutine's slot (from its LUA_EXTRASPACE) is its own
**    and one test of the per-state word that says whether hooks are on.
**  - luv, nothing set: a wrapper (a C closure over luv's own lua_CFunction)
**    that finds the running thread's slot, sees that nothing would observe
**    the registration (one per-state word: hooks, resources asked for,
**    tracked registrations; and the slot's frame bit) and calls luv's
**    function at once; and a cb_pcall (swapped in through
**    registry["luv_context"], whose first three fields are {loop, L,
**    cb_pcall}, as in src/luv.h) that finds the state (a one-entry cache),
**    checks that the callback is a plain function and that the loop's
**    thread has nothing set, runs luv's own cb_pcall in the root context
**    (ids 0) and restores the ids.
**  - the HTTP request path with a value set: wrapco/resume (a slot per
**    coroutine from a free list, ids, the creator's frame; the slot given
**    back at the end), lset (a new weak-keyed frame), get, track (a
**    callback-taking luv function's wrapper: with a frame set the callback
**    becomes a C closure over its context, fl_cb) and, with
**    luv_attach(true) and wrap_run, the dispatch the library must do for
**    it (fl_dispatch: luv calls the user's function itself); without,
**    luv calls fl_cb, which calls the callback (the "light" floor).
** What needs more than that (a thread whose slot is not its own, something
** set, a hook) is refused or counted: the floor has only the fast paths,
** and the cases check that they were taken.
*/
#include <stdint.h>
#include <string.h>

#include "lua.h"
#include "lauxlib.h"

#if defined(__GNUC__) || defined(__clang__)
#define FL_EXPORT __attribute__((visibility("default")))
#define FL_NOINLINE __attribute__((noinline))
#define fl_likely(x) __builtin_expect(((x) != 0), 1)
#define fl_unlikely(x) __builtin_expect(((x) != 0), 0)
#else
#define FL_EXPORT
#define FL_NOINLINE
#define fl_likely(x) (x)
#define fl_unlikely(x) (x)
#endif

/* the slot index lives in LUA_EXTRASPACE (it fits in every stock build) */
typedef char fl_extra_fits[LUA_EXTRASPACE >= sizeof(uintptr_t) ? 1 : -1];
#define fl_extra(L) (*(uintptr_t *)lua_getextraspace(L))

/* ------------------------------------------------------------------- */
/* the state: slots as the library keeps them (src/core.h, ah_slot)       */

#define FL_CAP 256

typedef struct fl_slot { /* the library's ah_slot layout (same stride) */
  lua_State *L;
  lua_Integer id, trigger, base_id, base_trigger;
  void *gctok;
  int next_free;
  unsigned scopes;
  unsigned char kind, destroyed, has_gc, anchored;
} fl_slot;

enum { FL_A_FRAME = 1 }; /* fl_slot.anchored: a frame is set */

typedef int (*fl_pcall)(lua_State *L, int nargs, int nresults, int flags);

typedef struct fl_state {
  fl_slot *slots; /* a pointer and a capacity: the library's array can grow */
  int cap;
  int used;
  /* luv: anything that makes a registration or a callback tracked (hooks
  ** enabled, resources asked for, tracked registrations alive); never set
  ** here, read where the library tests the same things */
  unsigned busy;
  fl_pcall luv_pcall; /* luv's own cb_pcall */
  lua_Integer n_wrapped, n_pcalls, n_slow; /* the case checks these */
  lua_Integer next_id;  /* asyncIds of tracked registrations */
  lua_Integer n_tracked, n_entered; /* request floor: the case checks these */
  int free_slot;        /* head of the free slots (next_free), -1: none */
  int fref, eref, rref; /* registry refs of F, of the root's empty frame, of R */
  int faithful;         /* luv_attach(true): callbacks as the library runs them */
  lua_CFunction run;    /* luv's uv.run (wrap_run) */
  lua_Integer n_direct; /* captures whose callback luv called itself */
  fl_slot inline_slots[FL_CAP];
} fl_state;

#define FL_ST lua_upvalueindex(1) /* light userdata: fl_state* */
#define FL_F lua_upvalueindex(2)  /* slot -> frame {token -> value} */
#define FL_FNS lua_upvalueindex(3) /* the table new() returns */
#define FL_WMT lua_upvalueindex(4) /* frames' metatable: weak keys */

static int unbound(lua_State *L) {
  return luaL_error(L, "floor: the thread's slot is not its own");
}

static int not_floor(lua_State *L) {
  return luaL_error(L, "floor: only the untracked path is implemented");
}

/* get(self): see the top of the file */
static int fl_get(lua_State *L) {
  const fl_state *st = (const fl_state *)lua_touserdata(L, FL_ST);
  uintptr_t s;
  if (fl_unlikely(lua_type(L, 1) != LUA_TTABLE))
    return luaL_typeerror(L, 1, "floor local");
  s = fl_extra(L);
  if (fl_unlikely(!(s < (uintptr_t)st->cap && st->slots[s].L == L)))
    return unbound(L);
  lua_rawgeti(L, FL_F, (lua_Integer)s); /* the frame */
  lua_rawgeti(L, 1, 1);                 /* the token */
  if (lua_rawget(L, -2) == LUA_TNIL) lua_getfield(L, 1, "default");
  return 1;
}

/* lcorolib's auxresume and luaB_coresume (Lua 5.4), unchanged but for the
** slot and hook checks in fl_resume */
static int auxresume(lua_State *L, lua_State *co, int narg) {
  int status, nres;
  if (fl_unlikely(!lua_checkstack(co, narg))) {
    lua_pushliteral(L, "too many arguments to resume");
    return -1;
  }
  lua_xmove(L, co, narg);
  status = lua_resume(co, L, narg, &nres);
  if (fl_likely(status == LUA_OK || status == LUA_YIELD)) {
    if (fl_unlikely(!lua_checkstack(L, nres + 1))) {
      lua_pop(co, nres);
      lua_pushliteral(L, "too many results to resume");
      return -1;
    }
    lua_xmove(co, L, nres);
    return nres;
  }
  lua_xmove(co, L, 1);
  return -1;
}

/* a slot from the free list (or a new one) */
static int take_slot(lua_State *L, fl_state *st) {
  int ns = st->free_slot;
  if (ns >= 0) {
    st->free_slot = st->slots[ns].next_free;
    return ns;
  }
  if (st->used >= st->cap) return luaL_error(L, "floor: out of slots");
  return st->used++;
}

/* a finished (or failed) coroutine gives its slot back: F[s] = nil */
static void give_slot(lua_State *L, fl_state *st, int s, int F) {
  lua_pushnil(L);
  lua_rawseti(L, F, s);
  st->slots[s].L = NULL;
  st->slots[s].anchored = 0;
  st->slots[s].next_free = st->free_slot;
  st->free_slot = s;
}

static int fl_resume(lua_State *L) {
  const fl_state *st = (const fl_state *)lua_touserdata(L, FL_ST);
  lua_State *co = lua_tothread(L, 1);
  uintptr_t s;
  int r;
  luaL_argexpected(L, co, 1, "coroutine");
  s = fl_extra(co);
  if (fl_unlikely(!(s < (uintptr_t)st->cap && st->slots[s].L == co)))
    return unbound(L);
  if (fl_unlikely(st->busy)) return not_floor(L); /* hooks: before/after */
  r = auxresume(L, co, lua_gettop(L) - 1);
  if (lua_status(co) != LUA_YIELD) give_slot(L, (fl_state *)st, (int)s, FL_F);
  if (fl_unlikely(r < 0)) {
    lua_pushboolean(L, 0);
    lua_insert(L, -2);
    return 2;
  }
  lua_pushboolean(L, 1);
  lua_insert(L, -(r + 1));
  return r + 1;
}

/* bind(co): a slot of its own for the coroutine, with its creator's frame
** (what the library's create does) */
static int fl_bind(lua_State *L) {
  fl_state *st = (fl_state *)lua_touserdata(L, FL_ST);
  lua_State *co = lua_tothread(L, 1);
  uintptr_t s = fl_extra(L);
  int ns;
  luaL_argexpected(L, co, 1, "coroutine");
  if (!(s < (uintptr_t)st->cap && st->slots[s].L == L)) return unbound(L);
  if (st->used >= st->cap) return luaL_error(L, "floor: out of slots");
  ns = st->used++;
  st->slots[ns].L = co;
  fl_extra(co) = (uintptr_t)ns;
  lua_rawgeti(L, FL_F, (lua_Integer)s);
  lua_rawseti(L, FL_F, ns);
  lua_pushinteger(L, ns);
  return 1;
}

/* the running thread's frame (slot s) becomes a new frame: a copy of it
** (unless empty) with the token at tok -> the value at val, weak-keyed as
** the library's frames are (disable() must be able to let values go);
** frames are immutable, so they are copied */
static void set_frame(lua_State *L, fl_state *st, uintptr_t s, int tok, int val) {
  int nf = lua_gettop(L) + 1;
  lua_createtable(L, 0, 1); /* nf: the new frame */
  if (st->slots[s].anchored & FL_A_FRAME) { /* copy what is set */
    lua_rawgeti(L, FL_F, (lua_Integer)s);
    lua_pushnil(L);
    while (lua_next(L, nf + 1)) {
      lua_pushvalue(L, -2);
      lua_insert(L, -2);
      lua_rawset(L, nf);
    }
    lua_settop(L, nf);
  }
  lua_pushvalue(L, tok);
  lua_pushvalue(L, val);
  lua_rawset(L, nf);
  lua_pushvalue(L, FL_WMT);
  lua_setmetatable(L, nf);
  lua_rawseti(L, FL_F, (lua_Integer)s);
  st->slots[s].anchored |= FL_A_FRAME;
}

/* set(token, value) */
static int fl_set(lua_State *L) {
  fl_state *st = (fl_state *)lua_touserdata(L, FL_ST);
  uintptr_t s = fl_extra(L);
  luaL_checktype(L, 1, LUA_TUSERDATA);
  lua_settop(L, 2);
  if (!(s < (uintptr_t)st->cap && st->slots[s].L == L)) return unbound(L);
  set_frame(L, st, s, 1, 2);
  return 0;
}

/* token(): a new token (a full userdata, as the library's) */
static int fl_token(lua_State *L) {
  *(unsigned *)lua_newuserdatauv(L, sizeof(unsigned), 0) = 0x41484c54u;
  return 1;
}

/* set(self, value) on a floor local (self[1] its token) */
static int fl_lset(lua_State *L) {
  fl_state *st = (fl_state *)lua_touserdata(L, FL_ST);
  uintptr_t s = fl_extra(L);
  if (fl_unlikely(lua_type(L, 1) != LUA_TTABLE))
    return luaL_typeerror(L, 1, "floor local");
  lua_settop(L, 2);
  if (fl_unlikely(!(s < (uintptr_t)st->cap && st->slots[s].L == L)))
    return unbound(L);
  lua_rawgeti(L, 1, 1); /* 3: the token */
  set_frame(L, st, s, 3, 2);
  return 0;
}

/* the function wrapco returns: lcorolib's auxwrap with the slot check, and
** the slot given back when the coroutine ends.  Upvalues: ST, F, thread. */
static int fl_auxwrap(lua_State *L) {
  fl_state *st = (fl_state *)lua_touserdata(L, FL_ST);
  lua_State *co = lua_tothread(L, lua_upvalueindex(3));
  uintptr_t s = fl_extra(co);
  int r;
  if (fl_unlikely(!(s < (uintptr_t)st->cap && st->slots[s].L == co)))
    return unbound(L);
  if (fl_unlikely(st->busy)) return not_floor(L);
  r = auxresume(L, co, lua_gettop(L));
  if (lua_status(co) != LUA_YIELD) give_slot(L, st, (int)s, FL_F);
  if (fl_unlikely(r < 0)) return lua_error(L);
  return r;
}

/* wrapco(f): coroutine.wrap with a slot of its own for the coroutine, its
** asyncId, its creator's id as trigger and its creator's frame (what the
** library's wrap does) */
static int fl_wrapco(lua_State *L) {
  fl_state *st = (fl_state *)lua_touserdata(L, FL_ST);
  uintptr_t s = fl_extra(L);
  lua_State *co;
  int ns;
  luaL_checktype(L, 1, LUA_TFUNCTION);
  if (fl_unlikely(!(s < (uintptr_t)st->cap && st->slots[s].L == L)))
    return unbound(L);
  ns = take_slot(L, st);
  co = lua_newthread(L);
  lua_pushvalue(L, 1);
  lua_xmove(L, co, 1);
  st->slots[ns].L = co;
  st->slots[ns].id = ++st->next_id;
  st->slots[ns].trigger = st->slots[s].id;
  st->slots[ns].anchored = st->slots[s].anchored & FL_A_FRAME;
  fl_extra(co) = (uintptr_t)ns;
  lua_rawgeti(L, FL_F, (lua_Integer)s);
  lua_rawseti(L, FL_F, ns);
  lua_pushvalue(L, FL_ST);
  lua_pushvalue(L, FL_F);
  lua_rotate(L, -3, 2); /* ST, F, thread */
  lua_pushcclosure(L, fl_auxwrap, 3);
  return 1;
}

/* ------------------------------------------------------------------- */
/* luv                                                                   */

typedef struct fl_luv_ctx { /* prefix of luv_ctx_t (src/luv.h) */
  void *loop;
  lua_State *L;
  fl_pcall cb_pcall;
} fl_luv_ctx;

static const char fl_key = 0; /* registry[&fl_key]: the state luv runs in */
/* the state of the thread luv last called back on: one entry, checked */
static lua_State *cache_L;
static fl_state *cache_st;

typedef struct fl_fn {
  lua_CFunction orig;
  fl_state *st;
  int pos; /* track: the callback's position */
} fl_fn;

/* the wrapper of a luv function: see the top of the file */
static int fl_wrapped(lua_State *L) {
  const fl_fn *w = (const fl_fn *)lua_touserdata(L, lua_upvalueindex(1));
  fl_state *st = w->st;
  uintptr_t s = fl_extra(L);
  if (fl_unlikely(!(s < (uintptr_t)st->cap && st->slots[s].L == L)))
    return unbound(L);
  if (fl_unlikely(st->busy || (st->slots[s].anchored & FL_A_FRAME)))
    return not_floor(L);
  st->n_wrapped++;
  return w->orig(L);
}

/* wrap(f) -> the wrapper of luv's C function f (no upvalues) */
static int fl_wrap(lua_State *L) {
  lua_CFunction f = lua_tocfunction(L, 1);
  fl_fn *w;
  luaL_argexpected(L, f != NULL && lua_getupvalue(L, 1, 1) == NULL, 1,
                   "C function without upvalues");
  w = (fl_fn *)lua_newuserdatauv(L, sizeof(fl_fn), 0);
  w->orig = f;
  w->st = (fl_state *)lua_touserdata(L, FL_ST);
  lua_pushcclosure(L, fl_wrapped, 1);
  return 1;
}

/* A tracked registration's callback: a C closure over (callback, frame,
** asyncId, triggerAsyncId, F), one allocation.  luv calls it through
** fl_cb_pcall (below), which has checked the thread and its slot and put
** the root ids in place: it enters the registration's context, calls the
** callback and restores (on an error, fl_cb_pcall restores). */
static int fl_cb(lua_State *L) {
  fl_state *st = cache_st;
  uintptr_t s = fl_extra(L);
  fl_slot *sl;
  lua_Integer pid, ptrig;
  unsigned char pa;
  int n = lua_gettop(L);
  if (fl_unlikely(L != cache_L || !(s < (uintptr_t)st->cap && st->slots[s].L == L)))
    return unbound(L);
  sl = &st->slots[s];
  pid = sl->id;
  ptrig = sl->trigger;
  pa = sl->anchored;
  sl->id = lua_tointeger(L, lua_upvalueindex(3));
  sl->trigger = lua_tointeger(L, lua_upvalueindex(4));
  lua_rawgeti(L, lua_upvalueindex(5), (lua_Integer)s);
  lua_insert(L, 1); /* the frame before, kept at 1 */
  lua_pushvalue(L, lua_upvalueindex(2));
  lua_rawseti(L, lua_upvalueindex(5), (lua_Integer)s);
  sl->anchored = (unsigned char)(pa | FL_A_FRAME);
  lua_pushvalue(L, lua_upvalueindex(1));
  lua_insert(L, 2);
  st->n_entered++;
  lua_call(L, n, 0);
  sl = &st->slots[s];
  lua_rawseti(L, lua_upvalueindex(5), (lua_Integer)s); /* the frame before */
  sl->anchored = pa;
  sl->id = pid;
  sl->trigger = ptrig;
  return 0;
}

/* the wrapper of a callback-taking luv function (track): nothing set, it
** is fl_wrapped; a frame set, the callback becomes an fl_cb closure with a
** new asyncId */
static int fl_twrapped(lua_State *L) {
  const fl_fn *w = (const fl_fn *)lua_touserdata(L, lua_upvalueindex(1));
  fl_state *st = w->st;
  uintptr_t s = fl_extra(L);
  int pos = w->pos;
  if (fl_unlikely(!(s < (uintptr_t)st->cap && st->slots[s].L == L)))
    return unbound(L);
  if (fl_unlikely(st->busy)) return not_floor(L);
  if (!(st->slots[s].anchored & FL_A_FRAME) || lua_isnoneornil(L, pos)) {
    st->n_wrapped++;
    return w->orig(L);
  }
  if (fl_unlikely(lua_type(L, pos) != LUA_TFUNCTION)) return not_floor(L);
  lua_pushvalue(L, pos);
  lua_rawgeti(L, lua_upvalueindex(2), (lua_Integer)s);
  lua_pushinteger(L, ++st->next_id);
  lua_pushinteger(L, st->slots[s].id);
  lua_pushvalue(L, lua_upvalueindex(2));
  lua_pushcclosure(L, fl_cb, 5);
  lua_replace(L, pos);
  st->n_tracked++;
  return w->orig(L);
}

/* track(f, pos) -> the tracking wrapper of luv's C function f, callback
** at pos */
static int fl_track(lua_State *L) {
  lua_CFunction f = lua_tocfunction(L, 1);
  lua_Integer pos = luaL_checkinteger(L, 2);
  fl_fn *w;
  luaL_argexpected(L, f != NULL && lua_getupvalue(L, 1, 1) == NULL, 1,
                   "C function without upvalues");
  luaL_argcheck(L, pos > 0 && pos < 16, 2, "bad position");
  w = (fl_fn *)lua_newuserdatauv(L, sizeof(fl_fn), 0);
  w->orig = f;
  w->st = (fl_state *)lua_touserdata(L, FL_ST);
  w->pos = (int)pos;
  lua_pushvalue(L, FL_F);
  lua_pushcclosure(L, fl_twrapped, 2);
  return 1;
}

/* what the fast path does not do: luv's own cb_pcall, counted */
static FL_NOINLINE int slow_pcall(lua_State *L, int nargs, int nresults,
                                     int flags) {
  fl_state *st;
  lua_rawgetp(L, LUA_REGISTRYINDEX, &fl_key);
  st = (fl_state *)lua_touserdata(L, -1);
  lua_pop(L, 1);
  st->n_slow++;
  cache_L = L;
  cache_st = st;
  return st->luv_pcall(L, nargs, nresults, flags);
}

/* The floor's uv.run (wrap_run): luv's, called in this C closure's frame,
** so that fl_cb_pcall, which luv calls from inside it, reads this
** closure's upvalues (the library's uv.run wrapper does the same). */
#define FR_F lua_upvalueindex(1)    /* F */
#define FR_R lua_upvalueindex(2)    /* R: slot -> the running capture */
#define FR_MARK lua_upvalueindex(3) /* &fl_key: we run inside fl_run */
static int fl_run(lua_State *L) {
  luaL_checkstack(L, LUA_MINSTACK + 8, "floor");
  return cache_st->run(L);
}

/* A capture's callback run the way the library must run it (the faithful
** mode): luv calls the user's function itself (an error's traceback is the
** one luv prints without any library: no frame of ours in it), so its
** context is entered here, around luv's own cb_pcall, with the frame kept
** alive on the stack below the function; R[s] holds the capture while it
** runs (what lets a resource be made lazily, as the library's R[s] does).
** Stack [X args] -> [X prev frame cb args] while it runs. */
static int fl_dispatch(lua_State *L, fl_state *st, int s, int nargs,
                       int nresults, int flags) {
  int base = lua_gettop(L) - nargs, ret;
  fl_slot *sl = &st->slots[s];
  lua_Integer pid = sl->id, ptrig = sl->trigger;
  lua_getupvalue(L, base, 3);
  lua_getupvalue(L, base, 4);
  sl->id = lua_tointeger(L, -2);
  sl->trigger = lua_tointeger(L, -1);
  lua_pop(L, 2);
  lua_rawgeti(L, FR_F, s);      /* prev */
  lua_getupvalue(L, base, 2);   /* frame */
  lua_getupvalue(L, base, 1);   /* cb */
  if (nargs) lua_rotate(L, base + 1, 3);
  lua_pushvalue(L, base + 2);
  lua_rawseti(L, FR_F, s);
  lua_pushvalue(L, base);
  lua_rawseti(L, FR_R, s);
  sl->anchored |= FL_A_FRAME;
  st->n_entered++;
  st->n_direct++;
  st->n_pcalls++;
  ret = st->luv_pcall(L, nargs, nresults, flags);
  sl = &st->slots[s];
  lua_pushvalue(L, base + 1);
  lua_rawseti(L, FR_F, s);
  lua_pushnil(L);
  lua_rawseti(L, FR_R, s);
  sl->anchored &= (unsigned char)~FL_A_FRAME;
  sl->id = pid;
  sl->trigger = ptrig;
  if (nresults == 0) {
    lua_settop(L, base - 1);
  } else { /* [X prev frame results] -> [results] */
    lua_rotate(L, base, -3);
    lua_pop(L, 3);
  }
  return ret;
}

/* the cb_pcall replacement: see the top of the file */
static int fl_cb_pcall(lua_State *L, int nargs, int nresults, int flags) {
  fl_state *st = cache_st;
  uintptr_t s = fl_extra(L);
  lua_Integer pid, ptrig;
  int ret;
  if (fl_unlikely(L != cache_L || !(s < (uintptr_t)st->cap && st->slots[s].L == L) ||
                  st->busy || (st->slots[s].anchored & FL_A_FRAME) ||
                  lua_type(L, -(nargs + 1)) != LUA_TFUNCTION))
    return slow_pcall(L, nargs, nresults, flags);
  if (st->faithful && lua_tocfunction(L, -(nargs + 1)) == fl_cb) {
    if (fl_unlikely(lua_touserdata(L, FR_MARK) != (void *)&fl_key))
      return slow_pcall(L, nargs, nresults, flags); /* not inside fl_run */
    return fl_dispatch(L, st, (int)s, nargs, nresults, flags);
  }
  pid = st->slots[s].id;
  ptrig = st->slots[s].trigger;
  st->slots[s].id = st->slots[s].trigger = 0;
  st->n_pcalls++;
  ret = st->luv_pcall(L, nargs, nresults, flags);
  if (fl_unlikely(st->slots[s].anchored & FL_A_FRAME)) { /* set inside, or an error in fl_cb */
    if (ret == LUA_OK) st->n_slow++;
    lua_rawgeti(L, LUA_REGISTRYINDEX, st->fref);
    lua_rawgeti(L, LUA_REGISTRYINDEX, st->eref);
    lua_rawseti(L, -2, (lua_Integer)s);
    lua_pop(L, 1);
    st->slots[s].anchored &= (unsigned char)~FL_A_FRAME;
  }
  st->slots[s].id = pid;
  st->slots[s].trigger = ptrig;
  return ret;
}

/* luv_attach(): luv's cb_pcall becomes fl_cb_pcall, for this state */
static int fl_luv_attach(lua_State *L) {
  fl_state *st = (fl_state *)lua_touserdata(L, FL_ST);
  fl_luv_ctx *ctx;
  if (lua_getfield(L, LUA_REGISTRYINDEX, "luv_context") != LUA_TUSERDATA)
    return luaL_error(L, "floor: luv is not loaded");
  ctx = (fl_luv_ctx *)lua_touserdata(L, -1);
  if (ctx->cb_pcall == fl_cb_pcall) return luaL_error(L, "floor: attached already");
  lua_getfield(L, FL_FNS, "state");
  lua_rawsetp(L, LUA_REGISTRYINDEX, &fl_key);
  st->luv_pcall = ctx->cb_pcall;
  ctx->cb_pcall = fl_cb_pcall;
  st->faithful = lua_toboolean(L, 1);
  cache_L = ctx->L;
  cache_st = st;
  { /* the library's registry warm-up (src/luv.c, warm_registry): any
    ** implementation can have it, so the floor has it too */
    int refs[32], i;
    for (i = 0; i < 32; i++) {
      lua_pushboolean(L, 0);
      refs[i] = luaL_ref(L, LUA_REGISTRYINDEX);
    }
    for (i = 31; i >= 0; i--) luaL_unref(L, LUA_REGISTRYINDEX, refs[i]);
  }
  return 0;
}

/* wrap_run(run) -> the floor's uv.run (fl_run) over luv's C function */
static int fl_wrap_run(lua_State *L) {
  fl_state *st = (fl_state *)lua_touserdata(L, FL_ST);
  lua_CFunction f = lua_tocfunction(L, 1);
  luaL_argexpected(L, f != NULL && lua_getupvalue(L, 1, 1) == NULL, 1,
                   "C function without upvalues");
  st->run = f;
  lua_pushvalue(L, FL_F);
  lua_rawgeti(L, LUA_REGISTRYINDEX, st->rref);
  lua_pushlightuserdata(L, (void *)&fl_key);
  lua_pushcclosure(L, fl_run, 3);
  return 1;
}

/* counts() -> wrapper calls, fast cb_pcall calls, slow ones, tracked
** registrations, tracked callbacks entered, of which run faithfully */
static int fl_counts(lua_State *L) {
  const fl_state *st = (const fl_state *)lua_touserdata(L, FL_ST);
  lua_pushinteger(L, st->n_wrapped);
  lua_pushinteger(L, st->n_pcalls);
  lua_pushinteger(L, st->n_slow);
  lua_pushinteger(L, st->n_tracked);
  lua_pushinteger(L, st->n_entered);
  lua_pushinteger(L, st->n_direct);
  return 6;
}

/* ------------------------------------------------------------------- */

/* new() -> {get, resume, bind, set, token, wrap, luv_attach, counts,
** state}: a state of its own; the calling thread (the main one) takes the
** slot its extra space names, as the library's main thread does (slot 0:
** Lua starts the extra space zeroed) */
static int fl_new(lua_State *L) {
  fl_state *st = (fl_state *)lua_newuserdatauv(L, sizeof(fl_state), 0); /* 1 */
  uintptr_t s = fl_extra(L);
  static const luaL_Reg fns[] = {
    {"get", fl_get}, {"resume", fl_resume}, {"bind", fl_bind},
    {"set", fl_set}, {"token", fl_token}, {"wrap", fl_wrap},
    {"luv_attach", fl_luv_attach}, {"counts", fl_counts},
    {"lset", fl_lset}, {"wrapco", fl_wrapco}, {"track", fl_track},
    {"wrap_run", fl_wrap_run},
    {NULL, NULL}
  };
  memset(st, 0, sizeof *st);
  st->slots = st->inline_slots;
  st->cap = FL_CAP;
  if (s >= FL_CAP) return luaL_error(L, "floor: the main thread's extra space is in use");
  st->slots[s].L = L;
  st->used = (int)s + 1;
  st->free_slot = -1;
  lua_createtable(L, 0, 12); /* 2: the functions */
  lua_pushvalue(L, 1);
  lua_setfield(L, 2, "state"); /* anchors the state */
  lua_pushlightuserdata(L, st);
  lua_createtable(L, FL_CAP, 0); /* F */
  lua_newtable(L);
  lua_pushvalue(L, -1);
  st->eref = luaL_ref(L, LUA_REGISTRYINDEX); /* the root's empty frame */
  lua_rawseti(L, -2, (lua_Integer)s);
  lua_pushvalue(L, -1);
  st->fref = luaL_ref(L, LUA_REGISTRYINDEX);
  lua_createtable(L, FL_CAP, 0); /* R */
  st->rref = luaL_ref(L, LUA_REGISTRYINDEX);
  lua_pushvalue(L, 2);
  lua_createtable(L, 0, 1); /* frames' metatable */
  lua_pushliteral(L, "k");
  lua_setfield(L, -2, "__mode");
  luaL_setfuncs(L, fns, 4);
  return 1;
}

FL_EXPORT int luaopen_floor(lua_State *L) {
  lua_createtable(L, 0, 1);
  lua_pushcfunction(L, fl_new);
  lua_setfield(L, -2, "new");
  return 1;
}
