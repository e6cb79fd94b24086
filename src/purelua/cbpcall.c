/*
** cbpcall.c - async_hooks.luvcb, the optional C helper of the pure-Lua
** backend (lua/async_hooks/backend/luv_lua.lua) on LuaJIT and Lua 5.1 to
** 5.3.  Built against the Lua headers only: no link to liblua, luv or libuv.
**
** luv calls every Lua callback through ctx->cb_pcall(L, nargs, nresults,
** flags), with the function and its arguments on the stack.  The backend
** hands luv a record of its own in place of the user's callback; without
** this helper the record's __call runs the callback through pcall and
** raises its error again, so the traceback luv prints starts there.  This
** helper puts its own cb_pcall in front of luv's: for a record of the
** backend it calls enter(rec) (the record's context in place; it returns
** the user's callback), puts the user's callback where the record was and
** lets luv's own cb_pcall call it, so that luv's message handler sees the
** same stack as without the library; then, whether the callback returned
** or raised, leave(rec, prev, ok) restores the context.  Anything else
** (a callback registered before install(), a function the backend does not
** wrap) goes to luv's cb_pcall untouched.
**
** uv.run is replaced by a C function too (run_closure): the backend
** delivers its queued destroys when uv.run starts, and a Lua wrapper would
** show up in tracebacks as a frame of its own.
**
** Everything is per Lua state, in the registry: the state (`hstate`) in
** a table under the address of `key`, the backend's functions under
** references the state keeps; each thread remembers the state it used
** last, so that a callback finds it without a lookup.
*/
#ifdef LUVCB_CHECK_LUV_H
#define _POSIX_C_SOURCE 200809L /* libuv's header needs pthread_rwlock_t */
#endif
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lua.h"
#include "lauxlib.h"

#define LUVCB_NOEXIT 0x01   /* luv's LUVF_CALLBACK_NOEXIT */
#define LUVCB_NOERRMSG 0x04 /* luv's LUVF_CALLBACK_NOERRMSG */

#if LUA_VERSION_NUM >= 502
#define luvcb_rawlen lua_rawlen
#define luvcb_setfuncs(L, f) luaL_setfuncs(L, f, 0)
#else
#define luvcb_rawlen lua_objlen
#define luvcb_setfuncs(L, f) luaL_register(L, NULL, f)
#endif

typedef int (*luv_pcall_fn)(lua_State *L, int nargs, int nresults, int flags);
typedef int (*luv_cpcall_fn)(lua_State *L, lua_CFunction func, void *ud, int flags);

/* luv's luv_ctx_t as of luv 1.42 (1.44 in Debian, and the current one:
** `mode` and `extra` came later than the first three fields, whose layout
** has not changed since 1.30) */
typedef struct {
  void *loop;
  lua_State *L;
  luv_pcall_fn cb_pcall;
  luv_pcall_fn thrd_pcall;
  luv_cpcall_fn thrd_cpcall;
  int mode;
  void *extra;
} luv_ctx;

#ifdef LUVCB_CHECK_LUV_H
/* built with luv's own header (the project's build does when it is there):
** the layout above must be luv's */
#include <luv/luv.h>
#define LUVCB_SAME(a, b) ((a) == (b) ? 1 : -1)
typedef char luvcb_check_size[LUVCB_SAME(sizeof(luv_ctx_t), sizeof(luv_ctx))];
typedef char luvcb_check_cb[LUVCB_SAME(offsetof(luv_ctx_t, cb_pcall), offsetof(luv_ctx, cb_pcall))];
typedef char luvcb_check_thrd[LUVCB_SAME(offsetof(luv_ctx_t, thrd_pcall), offsetof(luv_ctx, thrd_pcall))];
typedef char luvcb_check_mode[LUVCB_SAME(offsetof(luv_ctx_t, mode), offsetof(luv_ctx, mode))];
typedef char luvcb_check_flag[LUVCB_SAME(LUVF_CALLBACK_NOEXIT, LUVCB_NOEXIT)];
typedef char luvcb_check_nomsg[LUVCB_SAME(LUVF_CALLBACK_NOERRMSG, LUVCB_NOERRMSG)];
#endif

typedef struct {
  luv_ctx *ctx;      /* luv's context (NULL: never attached) */
  luv_pcall_fn orig; /* luv's cb_pcall, found in ctx when attached */
  int attached;      /* 0: every callback goes to orig untouched */
  int in_chain;      /* ctx's cb_pcall calls this one (directly, or a
                     ** function put in front of it later does) */
  int flags;         /* added to every callback's flags (tests) */
  int ref[4];        /* registry references of the backend's enter, leave,
                     ** records' metatable and fnrec (0: none yet) */
  const void *regmt; /* the records' metatable */
} hstate;
enum { R_ENTER, R_LEAVE, R_REGMT, R_FNREC };

/* the registry key of the table {hstate} that anchors the state */
static const char key = 0;
enum { T_STATE = 1 };

/* the state of the Lua state that cb_pcall was last called with on this
** thread (luv calls it with its main state; a luv thread has a state of
** its own), found without a lookup where the compiler has thread-local
** storage */
#if defined(__GNUC__) && !defined(LUVCB_NO_CACHE)
#define LUVCB_CACHE 1
static __thread lua_State *cache_L = NULL;
static __thread hstate *cache_st = NULL;
#else
#define LUVCB_CACHE 0
#endif

/* For a callback whose state cannot be found (no stack left for the
** lookup, or the table gone), that state's own chain behind this helper is
** unknown.  The fallback is the cb_pcall the first attached state had
** (luv's default, or the host's own, as Neovim's, which reports an error
** without ending the process), written once atomically: luv threads
** attach their states concurrently.  Where it is not known, bare_pcall
** runs the callback. */
#if defined(__clang__) || (defined(__GNUC__) && (__GNUC__ > 4 || (__GNUC__ == 4 && __GNUC_MINOR__ >= 7)))
static luv_pcall_fn fallback = NULL;
#define luvcb_get_fallback() __atomic_load_n(&fallback, __ATOMIC_ACQUIRE)
static void learn_fallback(const luv_ctx *ctx) {
  luv_pcall_fn none = NULL;
  __atomic_compare_exchange_n(&fallback, &none, ctx->cb_pcall, 0, __ATOMIC_ACQ_REL,
                              __ATOMIC_ACQUIRE);
}
#else
#define luvcb_get_fallback() ((luv_pcall_fn)NULL)
#define learn_fallback(ctx) ((void)(ctx))
#endif

/* the last resort: the callback in lua_pcall (no stack needed), its error
** reported as luv's default reports it, without the traceback */
static int bare_pcall(lua_State *L, int nargs, int nresults, int flags) {
  int base = lua_gettop(L) - nargs - 1;
  int r = lua_pcall(L, nargs, nresults, 0);
  const char *msg;
  if (r == 0) return nresults == LUA_MULTRET ? lua_gettop(L) - base : nresults;
  if (!(flags & LUVCB_NOERRMSG)) {
    msg = lua_tostring(L, -1);
    fprintf(stderr, "%s: %s\n", r == LUA_ERRMEM ? "System Error" : "Uncaught Error",
            msg != NULL ? msg : "(null)"); /* (luv prints a NULL with %s) */
  }
  if (!(flags & LUVCB_NOEXIT)) exit(-1);
  lua_pop(L, 1);
  return -r;
}

static int push_table(lua_State *L) {
  lua_pushlightuserdata(L, (void *)&key);
  lua_rawget(L, LUA_REGISTRYINDEX);
  if (lua_istable(L, -1)) return 1;
  lua_pop(L, 1);
  return 0;
}

/* L's state: the cached one, or the registry's (two slots); NULL when
** there is no stack for the lookup or no table */
static hstate *find_state(lua_State *L) {
  hstate *st;
#if LUVCB_CACHE
  if (L == cache_L) return cache_st;
#endif
  if (!lua_checkstack(L, 2) || !push_table(L)) return NULL;
  lua_rawgeti(L, -1, T_STATE);
  st = (hstate *)lua_touserdata(L, -1);
  lua_pop(L, 2);
#if LUVCB_CACHE
  cache_L = L, cache_st = st;
#endif
  return st;
}

/* raises its argument again: an error of enter or leave goes to luv's
** cb_pcall as a callback's error would */
static int rethrow(lua_State *L) {
  lua_settop(L, 1);
  return lua_error(L);
}

/* the error on top replaces everything from idx up; luv's cb_pcall
** reports it (and exits, unless the flags say not to) */
static int report(lua_State *L, hstate *st, int idx, int nresults, int flags) {
  lua_replace(L, idx);
  lua_settop(L, idx);
  lua_pushcfunction(L, rethrow);
  lua_insert(L, idx);
  return st->orig(L, 1, nresults, flags);
}

static int cb_pcall(lua_State *L, int nargs, int nresults, int flags) {
  int fn = lua_gettop(L) - nargs;
  int ours = 0, r;
  hstate *st = find_state(L);
  if (st == NULL) {
    luv_pcall_fn f = luvcb_get_fallback();
    return (f != NULL ? f : bare_pcall)(L, nargs, nresults, flags);
  }
  flags |= st->flags;
  /* no room to take the record: the callback to this state's own chain,
  ** untouched (the record's __call runs it) */
  if (!lua_checkstack(L, 8)) return st->orig(L, nargs, nresults, flags);
  if (st->attached) {
    /* the record: fn itself (a table of the backend's metatable), or the
    ** one a closure of the backend stands for; -> [fn args enter rec] */
    if (lua_type(L, fn) == LUA_TTABLE) {
      if (lua_getmetatable(L, fn)) {
        ours = lua_topointer(L, -1) == st->regmt;
        lua_pop(L, 1);
        if (ours) {
          lua_rawgeti(L, LUA_REGISTRYINDEX, st->ref[R_ENTER]);
          lua_pushvalue(L, fn);
        }
      }
    } else if (lua_type(L, fn) == LUA_TFUNCTION) {
      lua_rawgeti(L, LUA_REGISTRYINDEX, st->ref[R_FNREC]);
      lua_pushvalue(L, fn);
      lua_rawget(L, -2);
      ours = !lua_isnil(L, -1);
      if (ours) {
        lua_rawgeti(L, LUA_REGISTRYINDEX, st->ref[R_ENTER]);
        lua_replace(L, -3);
      } else {
        lua_pop(L, 2);
      }
    }
  }
  if (!ours) return st->orig(L, nargs, nresults, flags);
  /* enter(rec) -> [fn args rec prev cb] */
  if (lua_pcall(L, 1, 3, 0) != 0) return report(L, st, fn, nresults, flags);
  /* -> [rec prev cb args]: luv calls cb as it would have without us */
  lua_replace(L, fn);
  lua_insert(L, fn);
  lua_insert(L, fn);
  r = st->orig(L, nargs, nresults, flags);
  /* [rec prev results] -> leave(rec, prev, ok) */
  lua_rawgeti(L, LUA_REGISTRYINDEX, st->ref[R_LEAVE]);
  lua_pushvalue(L, fn);
  lua_pushvalue(L, fn + 1);
  lua_pushboolean(L, r >= 0);
  if (lua_pcall(L, 3, 0, 0) != 0) return report(L, st, fn, nresults, flags);
  lua_remove(L, fn);
  lua_remove(L, fn);
  return r;
}

/* luv's context, checked: a full userdata of luv's size whose fields look
** like luv's; NULL with the reason pushed */
static luv_ctx *find_ctx(lua_State *L) {
  luv_ctx *ctx;
  lua_getfield(L, LUA_REGISTRYINDEX, "luv_context");
  if (lua_type(L, -1) != LUA_TUSERDATA) {
    lua_pushstring(L, "luv is not loaded in this Lua state (no registry.luv_context)");
    return NULL;
  }
  ctx = (luv_ctx *)lua_touserdata(L, -1);
  if (luvcb_rawlen(L, -1) != sizeof(luv_ctx)) {
    lua_pushstring(L, "registry.luv_context is not the context of luv 1.42 or later");
    return NULL;
  }
  if (ctx->loop == NULL || ctx->L == NULL || ctx->cb_pcall == NULL || ctx->mode < -1 ||
      ctx->mode > 2) {
    lua_pushstring(L, "registry.luv_context does not look like luv's context");
    return NULL;
  }
  lua_pop(L, 1);
  return ctx;
}

static hstate *get_state(lua_State *L) {
  hstate *st;
  if (!push_table(L)) return NULL;
  lua_rawgeti(L, -1, T_STATE);
  st = (hstate *)lua_touserdata(L, -1);
  lua_pop(L, 2);
  return st;
}

/* attach(enter, leave, regmt, fnrec): cb_pcall in front of luv's
** (idempotent: a second luv table shares the state's context); true, or
** nil and why not */
static int l_attach(lua_State *L) {
  luv_ctx *ctx;
  hstate *st;
  int i;
  luaL_checktype(L, 1, LUA_TFUNCTION);
  luaL_checktype(L, 2, LUA_TFUNCTION);
  luaL_checktype(L, 3, LUA_TTABLE);
  luaL_checktype(L, 4, LUA_TTABLE);
  lua_settop(L, 4);
  ctx = find_ctx(L);
  if (ctx == NULL) {
    lua_pushnil(L);
    lua_insert(L, -2);
    return 2;
  }
  st = get_state(L);
  if (st == NULL) {
    lua_createtable(L, 1, 0);
    st = (hstate *)lua_newuserdata(L, sizeof(hstate));
    memset(st, 0, sizeof(*st));
    luaL_getmetatable(L, "async_hooks.luvcb");
    lua_setmetatable(L, -2);
    lua_rawseti(L, -2, T_STATE);
    lua_pushlightuserdata(L, (void *)&key);
    lua_pushvalue(L, -2);
    lua_rawset(L, LUA_REGISTRYINDEX);
  }
  for (i = 0; i < 4; i++) {
    lua_pushvalue(L, i + 1);
    if (st->ref[i] == 0) {
      st->ref[i] = luaL_ref(L, LUA_REGISTRYINDEX);
    } else {
      lua_rawseti(L, LUA_REGISTRYINDEX, st->ref[i]);
    }
  }
  st->regmt = lua_topointer(L, 3);
  /* (still in the chain behind a cb_pcall put in front later: that one
  ** calls this one, which must not chain to it in turn) */
  if (st->ctx != ctx || !st->in_chain) {
    st->ctx = ctx;
    st->orig = ctx->cb_pcall;
    learn_fallback(ctx);
    ctx->cb_pcall = cb_pcall;
    st->in_chain = 1;
  }
  st->attached = 1;
  lua_pushboolean(L, 1);
  return 1;
}

/* detach(): luv's cb_pcall back (when it is still ours in luv's context;
** otherwise something put its own in front of ours later and calls ours,
** which then passes every callback on untouched, and a later attach()
** takes them again without chaining to it) */
static int l_detach(lua_State *L) {
  hstate *st = get_state(L);
  if (st == NULL || !st->attached) return 0;
  st->attached = 0;
  if (st->ctx->cb_pcall == cb_pcall) {
    st->ctx->cb_pcall = st->orig;
    st->in_chain = 0;
  }
  return 0;
}

/* attached(): whether this helper takes the backend's callbacks now */
static int l_attached(lua_State *L) {
  hstate *st = get_state(L);
  lua_pushboolean(L, st != NULL && st->attached && st->in_chain);
  return 1;
}

/* flags(n): luv's LUVF_CALLBACK_* flags added to every callback (for tests
** that need a callback's error not to end the process) */
static int l_flags(lua_State *L) {
  hstate *st = get_state(L);
  int flags = (int)luaL_checkinteger(L, 1);
  if (st == NULL) return luaL_error(L, "async_hooks.luvcb: flags() before attach() in this Lua state");
  st->flags = flags;
  return 0;
}

/* uv.run's replacement: flush(), then luv's run itself, called as C (no
** frame of its own: run's argument errors and tracebacks are luv's) */
static int run_closure(lua_State *L) {
  lua_CFunction run = lua_tocfunction(L, lua_upvalueindex(1));
  lua_pushvalue(L, lua_upvalueindex(2));
  lua_call(L, 0, 0);
  return run(L);
}

/* run(luv_run, flush): the replacement of uv.run, or nil when luv's run
** is not a C function without upvalues (run_closure calls it with its own
** upvalues: one that has some, as coroutine.wrap's, would read those) */
static int l_run(lua_State *L) {
  luaL_checktype(L, 2, LUA_TFUNCTION);
  if (lua_tocfunction(L, 1) == NULL) return 0;
  if (lua_getupvalue(L, 1, 1) != NULL) return 0;
  lua_settop(L, 2);
  lua_pushcclosure(L, run_closure, 2);
  return 1;
}

/* a string error that the runtime's coroutine.wrap prefixes with its
** caller's position (Lua 5.1 and 5.2 take numbers too) */
#if LUA_VERSION_NUM >= 503
#define luvcb_where_type(L, i) (lua_type(L, i) == LUA_TSTRING)
#else
#define luvcb_where_type(L, i) lua_isstring(L, i)
#endif

/* the function coroutine.wrap returns: resume(co, ...) (the backend's),
** its results, or its error raised from here as the runtime's own wrap
** raises it (with the caller's position where the runtime adds it), so
** that a traceback has the frames it has without the library */
static int wrap_closure(lua_State *L) {
  lua_pushvalue(L, lua_upvalueindex(2));
  lua_insert(L, 1);
  lua_pushvalue(L, lua_upvalueindex(1));
  lua_insert(L, 2);
  lua_call(L, lua_gettop(L) - 1, LUA_MULTRET);
  if (lua_toboolean(L, 1)) return lua_gettop(L) - 1;
  lua_settop(L, 2);
  if (lua_toboolean(L, lua_upvalueindex(3)) && luvcb_where_type(L, 2)) {
    luaL_where(L, 1);
    lua_insert(L, -2);
    lua_concat(L, 2);
  }
  return lua_error(L);
}

/* wrap(co, resume, where): the function of coroutine.wrap for co (where:
** whether the runtime's wrap prefixes a position) */
static int l_wrap(lua_State *L) {
  luaL_checktype(L, 1, LUA_TTHREAD);
  luaL_checktype(L, 2, LUA_TFUNCTION);
  lua_settop(L, 3);
  lua_pushcclosure(L, wrap_closure, 3);
  return 1;
}

/* the state's __gc (the Lua state closes): luv's cb_pcall back, so that
** luv's own finalizers do not call this library once it is unloaded */
static int l_gc(lua_State *L) {
  hstate *st = (hstate *)lua_touserdata(L, 1);
#if LUVCB_CACHE
  if (cache_st == st) cache_L = NULL, cache_st = NULL;
#endif
  if (st->ctx != NULL && st->ctx->cb_pcall == cb_pcall) {
    st->ctx->cb_pcall = st->orig;
    st->in_chain = 0;
  }
  st->attached = 0;
  return 0;
}

static const luaL_Reg funcs[] = {
  {"attach", l_attach},
  {"detach", l_detach},
  {"attached", l_attached},
  {"flags", l_flags},
  {"run", l_run},
  {"wrap", l_wrap},
  {NULL, NULL},
};

LUALIB_API int luaopen_async_hooks_luvcb(lua_State *L) {
  if (luaL_newmetatable(L, "async_hooks.luvcb")) {
    lua_pushcfunction(L, l_gc);
    lua_setfield(L, -2, "__gc");
  }
  lua_pop(L, 1);
  lua_newtable(L);
  luvcb_setfuncs(L, funcs);
  return 1;
}
