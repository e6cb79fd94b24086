/*
** luv.c - the luv trampoline.
**
** Three pieces:
**  - registration wrappers (`luv_wrap`): a C closure that stands in for a
**    callback-taking luv function.  It finds the callback argument, and when
**    something could observe it (a hook enabled, a non-empty frame, or
**    executionAsyncResource() ever called) replaces it by a trampoline that
**    captured the registration's context, then calls the original function.
**    Otherwise the user's callback goes to luv untouched.
**  - the trampoline (`tramp`): enters the captured context (ids, resource,
**    frame), emits before/after when enabled, calls the user callback with
**    luv's arguments, restores; a one-shot request queues its destroy.
**  - a replacement for luv's cb_pcall (`ah_cb_pcall`), the function luv
**    calls every Lua callback through: it runs every callback, tracked or
**    not, in a fresh root context (asyncId 0, empty frame) and restores the
**    caller's context afterwards, also when the callback raised (then luv's
**    own handler has printed the error, with its traceback, before we run;
**    `after` is emitted for the trampolines the error unwound).  It also
**    flushes queued destroys once no callback is active.
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

/* registry[&luv_key]: a userdata holding this, user values 1 = enter
** closure, 2 = leave closure (both with the shared upvalues) */
typedef struct ah_luv {
  ah_luv_ctx *ctx;
  ah_luv_pcall orig;
  ah_state *st;
  int flags; /* or'ed into luv's flags (tests: 1 = no exit, 4 = no message) */
} ah_luv;

static const char luv_key = 0;

/* kinds of wrapped functions */
enum { K_HANDLE = 0, K_CREATE, K_CLOSE, K_REQ, K_WORK };

/* trampoline upvalues, after the shared ones */
#define T_CB lua_upvalueindex(AH_NUP + 1)
#define T_FRAME lua_upvalueindex(AH_NUP + 2)
#define T_RES lua_upvalueindex(AH_NUP + 3)
#define T_HANDLE lua_upvalueindex(AH_NUP + 4)
#define T_ID lua_upvalueindex(AH_NUP + 5)
#define T_TRIGGER lua_upvalueindex(AH_NUP + 6)
#define T_INFO lua_upvalueindex(AH_NUP + 7) /* W_INFO: op, names, one-shot */
#define T_NUP (AH_NUP + 7)
/* only in the trampoline of an op with named arguments whose resource was
** not made at registration (else reading them gives none) */
#define T_A1 lua_upvalueindex(AH_NUP + 8)
#define T_A2 lua_upvalueindex(AH_NUP + 9)
#define T_NUP_ARGS (AH_NUP + 9)

/* wrapper upvalues, after the shared ones */
#define W_ORIG lua_upvalueindex(AH_NUP + 1)
#define W_SPEC lua_upvalueindex(AH_NUP + 2)  /* see l_luv_wrap */
#define W_TYPE lua_upvalueindex(AH_NUP + 3)  /* nil: the handle's type */
#define W_HR lua_upvalueindex(AH_NUP + 4)    /* handle -> trampoline */
#define W_INFO lua_upvalueindex(AH_NUP + 5)  /* {op, name1, name2, one-shot,
                                                "op", "handle"} */
#define W_NUP (AH_NUP + 5)

/* ------------------------------------------------------------------- */
/* native stack of entered trampolines                                  */

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

/* ------------------------------------------------------------------- */
/* resources                                                             */

/* Push a registration's resource table {op =, handle =, <name> = value}:
** info is the wrapper's {op, name1, name2}; h, a1, a2 the handle and the
** two named arguments (0, none or nil: absent). */
static void push_res(lua_State *L, int info, int h, int a1, int a2) {
  int i, n = 1, v[2];
  info = lua_absindex(L, info);
  h = h && !lua_isnoneornil(L, h) ? lua_absindex(L, h) : 0;
  v[0] = a1 && !lua_isnoneornil(L, a1) ? lua_absindex(L, a1) : 0;
  v[1] = a2 && !lua_isnoneornil(L, a2) ? lua_absindex(L, a2) : 0;
  n += (h != 0) + (v[0] != 0) + (v[1] != 0);
  lua_createtable(L, 0, n);
  lua_rawgeti(L, info, 5); /* "op" (keys kept in info: no lookup by name) */
  lua_rawgeti(L, info, 1);
  lua_rawset(L, -3);
  if (h) {
    lua_rawgeti(L, info, 6); /* "handle" */
    lua_pushvalue(L, h);
    lua_rawset(L, -3);
  }
  for (i = 0; i < 2; i++) {
    if (!v[i]) continue;
    lua_rawgeti(L, info, i + 2); /* its name: set whenever a position is */
    lua_pushvalue(L, v[i]);
    lua_rawset(L, -3);
  }
}

/* is the registration whose info table is at idx a one-shot request? */
static int oneshot(lua_State *L, int idx) {
  int r;
  lua_rawgeti(L, idx, 4);
  r = lua_toboolean(L, -1);
  lua_pop(L, 1);
  return r;
}

/* A tracked registration made while nothing asked for resources (no init
** hook, executionAsyncResource() never called) has no resource table
** (T_RES nil) but keeps what one needs (T_INFO, T_HANDLE, T_A1, T_A2).
** R[s] normally holds false for "none": the trampoline stands in for it.
** While its callback runs, R[s] holds the trampoline itself (not anchored:
** it is on the stack meanwhile), and the first executionAsyncResource() in
** that callback or its before/after hooks makes the table here.  The value
** at the top is that function: replace it by the resource and return 1 when
** it is the trampoline of the callback running in slot s, else by false
** (e.g. an untracked callback nested in it) and return 0. */
static int tramp(lua_State *L);

int ah_luv_resource(lua_State *L, ah_state *st, int s) {
  int top = lua_gettop(L), ok;
  luaL_checkstack(L, 8, "async_hooks");
  ok = lua_tocfunction(L, top) == tramp;
  if (ok) {
    lua_getupvalue(L, top, AH_NUP + 5); /* T_ID */
    ok = lua_tointeger(L, -1) == st->slots[s].id;
    lua_pop(L, 1);
  }
  if (!ok) {
    lua_pushboolean(L, 0);
    lua_replace(L, top);
    return 0;
  }
  lua_getupvalue(L, top, AH_NUP + 3); /* T_RES (made by a nested entry?) */
  if (!lua_istable(L, -1)) {
    lua_getupvalue(L, top, AH_NUP + 7); /* T_INFO */
    lua_getupvalue(L, top, AH_NUP + 4); /* T_HANDLE */
    if (!lua_getupvalue(L, top, AH_NUP + 8)) lua_pushnil(L); /* T_A1 */
    if (!lua_getupvalue(L, top, AH_NUP + 9)) lua_pushnil(L); /* T_A2 */
    push_res(L, top + 2, top + 3, top + 4, top + 5);
    lua_replace(L, top + 1);
    lua_settop(L, top + 1);
    lua_pushvalue(L, -1);
    lua_setupvalue(L, top, AH_NUP + 3);
  }
  lua_replace(L, top);
  return 1;
}

/* ------------------------------------------------------------------- */
/* the trampoline                                                        */

static int tramp(lua_State *L) {
  ah_state *st = ah_st(L);
  int n = lua_gettop(L), s = ah_slot_of(L, st), i, status;
  lua_Integer id = lua_tointeger(L, T_ID);
  lua_Integer pid = st->slots[s].id, ptrig = st->slots[s].trigger;
  luaL_checkstack(L, n + 24, "async_hooks");
  ah_reserve(L, s);
  lua_rawgeti(L, AH_UV_R, s); /* n+1: previous resource */
  lua_rawgeti(L, AH_UV_F, s); /* n+2: previous frame */
  if (!cb_push(st, id)) return luaL_error(L, "not enough memory");
  st->slots[s].id = id;
  st->slots[s].trigger = lua_tointeger(L, T_TRIGGER);
  ah_set_resource(L, s, T_RES);
  if (lua_isnil(L, T_RES)) { /* not made yet: R[s] = this trampoline */
    lua_Debug ar;
    if (lua_getstack(L, 0, &ar) && lua_getinfo(L, "f", &ar)) lua_rawseti(L, AH_UV_R, s);
  }
  ah_set_frame(L, s, T_FRAME);
  st->active++;
  ah_emit_id(L, st, AH_BEFORE, id);
  lua_pushvalue(L, T_CB);
  for (i = 1; i <= n; i++) lua_pushvalue(L, i);
  /* Called this way only when the library's cb_pcall is not in front
  ** (after uninstall(), or if entering failed): restore on error too. */
  status = lua_pcall(L, n, 0, 0);
  ah_emit_id(L, st, AH_AFTER, id);
  cb_pop(st);
  s = ah_slot_of(L, st);
  st->slots[s].id = pid;
  st->slots[s].trigger = ptrig;
  ah_set_resource(L, s, n + 1);
  ah_set_frame(L, s, n + 2);
  st->active--;
  if (st->nhooks[AH_DESTROY] && oneshot(L, T_INFO)) ah_queue_destroy(st, id);
  ah_flush_maybe(L, st);
  if (status != LUA_OK) return lua_error(L); /* the error object is on top */
  return 0;
}

/* ------------------------------------------------------------------- */
/* registration wrappers                                                 */

static int observable(ah_state *st, int s) {
  return st->nhooks[AH_INIT] || st->nhooks[AH_BEFORE] || st->nhooks[AH_AFTER] ||
         st->nhooks[AH_DESTROY] || st->res_on || (st->slots[s].anchored & A_FRAME);
}

/* destroy the tracked registration of the handle at idx, if any */
static void forget_handle(lua_State *L, ah_state *st, int idx) {
  if (!st->handles || lua_type(L, idx) != LUA_TUSERDATA) return;
  lua_pushvalue(L, idx);
  if (lua_rawget(L, W_HR) == LUA_TFUNCTION) {
    lua_getupvalue(L, -1, AH_NUP + 5); /* T_ID */
    if (st->nhooks[AH_DESTROY]) ah_queue_destroy(st, lua_tointeger(L, -1));
    lua_pop(L, 1);
    lua_pushvalue(L, idx);
    lua_pushnil(L);
    lua_rawset(L, W_HR);
    st->handles--;
  }
  lua_pop(L, 1);
}

/* Call the original with the n values on top of the stack (the function
** is pushed below them); returns the number of results.  The original runs
** one C level deeper than it would without us, so luaL_argerror cannot name
** it ("bad argument #1 to '?'"): such a message is rewritten the way
** luaL_argerror would have written it with our caller's call site. */
/* luaL_argerror's last resort, for a function called without a name:
** "mod.field" where package.loaded[mod][field] is the running function */
static const char *global_name(lua_State *L, lua_Debug *ar) {
  const char *name = NULL;
  lua_getinfo(L, "f", ar);
  lua_getfield(L, LUA_REGISTRYINDEX, LUA_LOADED_TABLE);
  lua_pushnil(L);
  while (name == NULL && lua_next(L, -2)) {
    if (lua_type(L, -2) == LUA_TSTRING && lua_type(L, -1) == LUA_TTABLE) {
      lua_pushnil(L);
      while (lua_next(L, -2)) {
        if (lua_type(L, -2) == LUA_TSTRING && lua_rawequal(L, -1, -6)) {
          name = lua_pushfstring(L, "%s.%s", lua_tostring(L, -4), lua_tostring(L, -2));
          lua_replace(L, -7); /* keep it where the function was */
          lua_pop(L, 2);
          break;
        }
        lua_pop(L, 1);
      }
    }
    lua_pop(L, 1);
  }
  if (name == NULL) lua_pop(L, 2); /* loaded table, function */
  else lua_pop(L, 1);              /* loaded table (name replaced fn) */
  return name;
}

static int call_orig_n(lua_State *L, int n) {
  int base = lua_gettop(L) - n;
  lua_pushvalue(L, W_ORIG);
  lua_insert(L, base + 1);
  if (lua_pcall(L, n, LUA_MULTRET, 0) != LUA_OK) {
    const char *msg = lua_tostring(L, -1), *rest;
    int arg;
    lua_Debug ar;
    if (lua_type(L, -1) == LUA_TSTRING && sscanf(msg, "bad argument #%d to '?' (", &arg) == 1 &&
        (rest = strstr(msg, "' (")) != NULL && lua_getstack(L, 0, &ar) &&
        lua_getinfo(L, "n", &ar) && (ar.name || (ar.name = global_name(L, &ar)))) {
      rest += 2;
      luaL_where(L, 1);
      if (strcmp(ar.namewhat, "method") == 0 && --arg == 0)
        lua_pushfstring(L, "calling '%s' on bad self %s", ar.name, rest);
      else
        lua_pushfstring(L, "bad argument #%d to '%s' %s", arg, ar.name, rest);
      lua_concat(L, 2);
    }
    return lua_error(L);
  }
  return lua_gettop(L) - base;
}

static int call_orig(lua_State *L) {
  return call_orig_n(L, lua_gettop(L));
}

static int wrapped(lua_State *L) {
  ah_state *st = ah_st(L);
  int n = lua_gettop(L), pos = 0, s, spec = (int)lua_tointeger(L, W_SPEC);
  int kind = (spec >> 8) & 15, p1 = (spec >> 4) & 15, p2 = spec & 15;
  lua_Integer id, trigger;
  int nres, has_handle = kind != K_CREATE && kind != K_WORK &&
                         lua_type(L, 1) == LUA_TUSERDATA;
  const char *type;
  if (p1 && p1 <= n && ah_callable(L, p1))
    pos = p1;
  else if (p2 && p2 <= n && ah_callable(L, p2) && (p1 > n || lua_isnil(L, p1)))
    pos = p2;
  if (kind == K_CLOSE) forget_handle(L, st, 1); /* no more callbacks */
  if (!pos) return call_orig(L);         /* synchronous, or no callback */
  s = ah_slot_of(L, st);
  if (!observable(st, s)) {
    if (kind == K_HANDLE) forget_handle(L, st, 1);
    return call_orig(L);
  }
  luaL_checkstack(L, T_NUP + 8, "async_hooks");
  /* the resource type, only needed for init */
  if (!st->nhooks[AH_INIT])
    lua_pushnil(L);
  else if (!lua_isnil(L, W_TYPE))
    lua_pushvalue(L, W_TYPE);
  else if (!has_handle || luaL_getmetafield(L, 1, "__name") != LUA_TSTRING) {
    if (has_handle) lua_settop(L, n);
    lua_pushliteral(L, "uv_handle");
  }
  type = lua_tostring(L, -1); /* n+1, kept on the stack */
  id = st->next_id++;
  trigger = st->slots[s].id;
  /* the trampoline */
  ah_push_shared(L);
  lua_pushvalue(L, pos);                       /* T_CB */
  lua_rawgeti(L, AH_UV_F, s);                  /* T_FRAME */
  {
    int f1 = (spec >> 12) & 15, f2 = (spec >> 16) & 15, eager;
    f1 = f1 <= n ? f1 : 0; /* positions of the named arguments */
    f2 = f2 <= n ? f2 : 0;
    eager = st->nhooks[AH_INIT] || st->res_on;
    if (eager) push_res(L, W_INFO, has_handle ? 1 : 0, f1, f2); /* T_RES */
    else lua_pushnil(L);
    if (has_handle) lua_pushvalue(L, 1); else lua_pushnil(L); /* T_HANDLE */
    lua_pushinteger(L, id);                      /* T_ID */
    lua_pushinteger(L, trigger);                 /* T_TRIGGER */
    lua_pushvalue(L, W_INFO);                    /* T_INFO */
    if (eager || !(spec >> 12)) {
      lua_pushcclosure(L, tramp, T_NUP);         /* n+2 */
    } else { /* the named arguments, for a resource made later */
      if (f1) lua_pushvalue(L, f1); else lua_pushnil(L); /* T_A1 */
      if (f2) lua_pushvalue(L, f2); else lua_pushnil(L); /* T_A2 */
      lua_pushcclosure(L, tramp, T_NUP_ARGS);    /* n+2 */
    }
  }
  /* a handle's registration is destroyed when replaced or closed: keep it
  ** in HR when someone listens for destroys */
  forget_handle(L, st, 1);
  if (kind == K_HANDLE && st->nhooks[AH_DESTROY]) {
    lua_pushvalue(L, 1);
    lua_pushvalue(L, -2);
    lua_rawset(L, W_HR);
    st->handles++;
  }
  lua_pushvalue(L, -1);
  lua_replace(L, pos);
  /* call the original with the trampoline in the callback's place */
  for (int i = 1; i <= n; i++) lua_pushvalue(L, i);
  nres = call_orig_n(L, n);
  /* a handle made by this call (new_async, spawn) */
  if (kind == K_CREATE && nres > 0 && lua_type(L, n + 3) == LUA_TUSERDATA) {
    lua_pushvalue(L, n + 3);
    lua_setupvalue(L, n + 2, 4 + AH_NUP); /* T_HANDLE */
    lua_getupvalue(L, n + 2, 3 + AH_NUP); /* T_RES */
    if (lua_istable(L, -1)) {
      lua_pushvalue(L, n + 3);
      lua_setfield(L, -2, "handle");
    }
    lua_pop(L, 1);
    if (st->nhooks[AH_DESTROY]) {
      lua_pushvalue(L, n + 3);
      lua_pushvalue(L, n + 2);
      lua_rawset(L, W_HR);
      st->handles++;
    }
  }
  if (st->nhooks[AH_INIT]) {
    lua_getupvalue(L, n + 2, 3 + AH_NUP);
    ah_emit_init(L, st, id, type, trigger, -1);
    lua_pop(L, 1);
  }
  return nres;
}

/* luv_wrap(orig, p1, p2, kind, type|nil, HR, op[, {name, pos, ...}])
** -> wrapper.  op names the resource (field `op`); up to two arguments are
** copied into it under the names given (`path`, `host`, `port`, ...).
** W_SPEC = f2 << 16 | f1 << 12 | kind << 8 | p1 << 4 | p2 (4 bits each) */
static int l_luv_wrap(lua_State *L) {
  lua_Integer f[2] = {0, 0}, i;
  luaL_checktype(L, 1, LUA_TFUNCTION);
  lua_Integer p1 = luaL_checkinteger(L, 2), p2 = luaL_optinteger(L, 3, 0);
  lua_Integer kind = luaL_checkinteger(L, 4);
  luaL_argcheck(L, p1 >= 0 && p1 < 16 && p2 >= 0 && p2 < 16, 2, "bad position");
  luaL_argcheck(L, kind >= K_HANDLE && kind <= K_WORK, 4, "bad kind");
  luaL_checktype(L, 6, LUA_TTABLE);
  luaL_checktype(L, 7, LUA_TSTRING);
  lua_createtable(L, 6, 0); /* 9: info */
  lua_pushvalue(L, 7);
  lua_rawseti(L, 9, 1);
  lua_pushboolean(L, kind == K_CLOSE || kind == K_REQ); /* one-shot */
  lua_rawseti(L, 9, 4);
  lua_pushliteral(L, "op");
  lua_rawseti(L, 9, 5);
  lua_pushliteral(L, "handle");
  lua_rawseti(L, 9, 6);
  if (!lua_isnoneornil(L, 8)) {
    luaL_checktype(L, 8, LUA_TTABLE);
    for (i = 0; i < 2; i++) {
      if (lua_rawgeti(L, 8, 2 * i + 1) == LUA_TNIL) { lua_pop(L, 1); break; }
      luaL_argcheck(L, lua_type(L, -1) == LUA_TSTRING, 8, "bad field name");
      lua_rawseti(L, 9, i + 2);
      lua_rawgeti(L, 8, 2 * i + 2);
      f[i] = lua_tointeger(L, -1);
      luaL_argcheck(L, f[i] >= 1 && f[i] < 16, 8, "bad field position");
      lua_pop(L, 1);
    }
  }
  ah_push_shared(L);
  lua_pushvalue(L, 1);
  lua_pushinteger(L, (f[1] << 16) | (f[0] << 12) | (kind << 8) | (p1 << 4) | p2);
  lua_pushvalue(L, 5);
  lua_pushvalue(L, 6);
  lua_pushvalue(L, 9);
  lua_pushcclosure(L, wrapped, W_NUP);
  return 1;
}

/* ------------------------------------------------------------------- */
/* the cb_pcall safety net                                               */

/* enter(cb): save the current thread's context and enter the callback's:
** the one a trampoline captured (its before is emitted here, and the
** user's function is returned so that luv calls it directly: no extra
** frame in tracebacks), or else the root context.  Returns previous
** resource, frame, id, trigger, native stack depth, function to call. */
static int l_enter(lua_State *L) {
  ah_state *st = ah_st(L);
  int s = ah_slot_of(L, st);
  /* everything that can fail comes first: nothing has changed if it does */
  luaL_checkstack(L, 24, "async_hooks");
  ah_reserve(L, s);
  lua_rawgeti(L, AH_UV_R, s);
  lua_rawgeti(L, AH_UV_F, s);
  lua_pushinteger(L, st->slots[s].id);
  lua_pushinteger(L, st->slots[s].trigger);
  lua_pushinteger(L, (lua_Integer)st->cb_n);
  if (lua_tocfunction(L, 1) == tramp) {
    lua_Integer id, trigger;
    lua_getupvalue(L, 1, AH_NUP + 5); /* T_ID */
    id = lua_tointeger(L, -1);
    lua_getupvalue(L, 1, AH_NUP + 6); /* T_TRIGGER */
    trigger = lua_tointeger(L, -1);
    lua_pop(L, 2);
    lua_getupvalue(L, 1, AH_NUP + 3); /* T_RES */
    lua_getupvalue(L, 1, AH_NUP + 2); /* T_FRAME */
    lua_getupvalue(L, 1, AH_NUP + 1); /* T_CB */
    if (!cb_push(st, id)) return luaL_error(L, "not enough memory");
    /* switch (hook errors end the process) */
    st->active += 2;
    st->slots[s].id = id;
    st->slots[s].trigger = trigger;
    if (!lua_isnil(L, -3) || (st->slots[s].anchored & A_RES))
      ah_set_resource(L, s, -3);
    if (lua_isnil(L, -3)) { /* not made yet: R[s] = the trampoline */
      lua_pushvalue(L, 1);
      lua_rawseti(L, AH_UV_R, s);
    }
    ah_set_frame(L, s, -2);
    lua_rotate(L, -3, 1); /* cb below resource and frame */
    lua_pop(L, 2);
    ah_emit_id(L, st, AH_BEFORE, id);
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
  }
  return 6;
}

/* leave(res, frame, id, trigger, depth, cb): `after` for the callback's
** trampoline and any the error unwound, its destroy when one-shot,
** restore, flush */
static int l_leave(lua_State *L) {
  ah_state *st = ah_st(L);
  int s;
  size_t depth = (size_t)lua_tointeger(L, 5);
  while (st->cb_n > depth) {
    lua_Integer id = st->cb[st->cb_n - 1];
    ah_emit_id(L, st, AH_AFTER, id);
    cb_pop(st);
    st->active--;
  }
  if (lua_tocfunction(L, 6) == tramp && st->nhooks[AH_DESTROY]) {
    lua_getupvalue(L, 6, AH_NUP + 7); /* T_INFO */
    lua_getupvalue(L, 6, AH_NUP + 5); /* T_ID */
    if (oneshot(L, -2)) ah_queue_destroy(st, lua_tointeger(L, -1));
    lua_pop(L, 2);
  }
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

#define NSAVED 7 /* lv res frame id trigger depth cb */

/* Every luv callback comes through here.  The common case, a callback
** nobody tracked arriving while the thread's context is empty (uv.run at
** top level), needs no Lua calls: only the ids are switched.  Anything else
** goes through the enter/leave closures, called protected: enter does what
** can fail (allocations) before it changes anything, and leave allocates
** nothing (hook errors end the process). */
static int ah_cb_pcall(lua_State *L, int nargs, int nresults, int flags) {
  ah_luv *lv;
  ah_state *st;
  int base, ret, top;
  uintptr_t s;
  lua_rawgetp(L, LUA_REGISTRYINDEX, &luv_key);
  lv = (ah_luv *)lua_touserdata(L, -1);
  st = lv->st;
  base = lua_gettop(L) - nargs - 1; /* index of the callback */
  s = ah_extra(L);
  if (s < (uintptr_t)st->cap && st->slots[s].L == L &&
      !(st->slots[s].anchored & (A_FRAME | A_RES)) &&
      lua_tocfunction(L, base) != tramp) {
    lua_Integer pid = st->slots[s].id, ptrig = st->slots[s].trigger;
    size_t depth = st->cb_n;
    lua_pop(L, 1);
    st->slots[s].id = st->slots[s].trigger = 0;
    st->active++;
    ret = lv->orig(L, nargs, nresults, flags | lv->flags);
    if (!(st->slots[s].anchored & (A_FRAME | A_RES)) && st->cb_n == depth &&
        !(st->dq_n && st->active == 1 && !st->dispatching)) {
      st->fast_callbacks++;
      st->slots[s].id = pid;
      st->slots[s].trigger = ptrig;
      st->active--;
      return ret;
    }
    /* the callback set a value, or an error unwound trampolines, or
    ** destroys are due: the full leave() */
    if (!lua_checkstack(L, 10)) { /* no memory: restore what C can */
      while (st->cb_n > depth) { cb_pop(st); st->active--; }
      st->slots[s].id = pid;
      st->slots[s].trigger = ptrig;
      st->active--;
      return ret;
    }
    lua_rawgetp(L, LUA_REGISTRYINDEX, &luv_key);
    lua_getiuservalue(L, -1, 2);
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
  if (!lua_checkstack(L, 12)) { /* no memory: run it bare */
    lua_pop(L, 1);
    return lv->orig(L, nargs, nresults, flags | lv->flags);
  }
  lua_getiuservalue(L, -1, 1);
  lua_pushvalue(L, base);
  if (lua_pcall(L, 1, 6, 0) != LUA_OK) { /* out of memory, nothing entered */
    lua_settop(L, base + nargs);           /* luv calls the trampoline, */
    return lv->orig(L, nargs, nresults, flags | lv->flags); /* which copes */
  }
  /* [cb args lv res frame id trig depth fn] -> [fn args lv ... depth cb] */
  lua_pushvalue(L, base);
  lua_copy(L, -2, base);
  lua_remove(L, -2);
  lua_rotate(L, base, NSAVED); /* [lv res frame id trig depth cb fn args] */
  ret = lv->orig(L, nargs, nresults, flags | lv->flags);
  top = lua_gettop(L);
  lua_getiuservalue(L, base, 2);
  for (int i = 1; i < NSAVED; i++) lua_pushvalue(L, base + i);
  if (lua_pcall(L, NSAVED - 1, 0, 0) != LUA_OK) lua_pop(L, 1); /* cannot happen */
  lua_rotate(L, base, top - base - NSAVED + 1); /* results below our values */
  lua_settop(L, top - NSAVED);
  return ret;
}

/* luv_attach(): take over luv's cb_pcall (idempotent) */
static int l_luv_attach(lua_State *L) {
  ah_state *st = ah_st(L);
  ah_luv *lv;
  ah_luv_ctx *ctx;
  if (lua_getfield(L, LUA_REGISTRYINDEX, "luv_context") != LUA_TUSERDATA)
    return luaL_error(L, "luv is not loaded in this Lua state");
  ctx = (ah_luv_ctx *)lua_touserdata(L, -1);
  if (ctx->cb_pcall == ah_cb_pcall) return 0;
  lv = (ah_luv *)lua_newuserdatauv(L, sizeof(ah_luv), 2);
  lv->ctx = ctx;
  lv->orig = ctx->cb_pcall;
  lv->st = st;
  lv->flags = 0;
  ah_push_shared(L);
  lua_pushcclosure(L, l_enter, AH_NUP);
  lua_setiuservalue(L, -2, 1);
  ah_push_shared(L);
  lua_pushcclosure(L, l_leave, AH_NUP);
  lua_setiuservalue(L, -2, 2);
  lua_rawsetp(L, LUA_REGISTRYINDEX, &luv_key);
  ctx->cb_pcall = ah_cb_pcall;
  return 0;
}

/* luv_detach(): give cb_pcall back */
static int l_luv_detach(lua_State *L) {
  ah_luv *lv;
  lua_rawgetp(L, LUA_REGISTRYINDEX, &luv_key);
  lv = (ah_luv *)lua_touserdata(L, -1);
  if (lv && lv->ctx->cb_pcall == ah_cb_pcall) lv->ctx->cb_pcall = lv->orig;
  return 0;
}

/* luv_flags(n): LUVF_CALLBACK_* flags added to every callback (for tests
** that need a callback error not to end the process) */
static int l_luv_flags(lua_State *L) {
  ah_luv *lv;
  int flags = (int)luaL_checkinteger(L, 1);
  lua_rawgetp(L, LUA_REGISTRYINDEX, &luv_key);
  lv = (ah_luv *)lua_touserdata(L, -1);
  luaL_argcheck(L, lv != NULL, 1, "luv integration not attached");
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

static const luaL_Reg luv_funcs[] = {
  {"luv_wrap", l_luv_wrap},
  {"luv_attach", l_luv_attach},
  {"luv_detach", l_luv_detach},
  {"luv_attached", l_luv_attached},
  {"luv_flags", l_luv_flags},
  {NULL, NULL}
};

/* module table on top: the luv functions; slots.c asks ah_luv_resource
** for the lazily made resource of a running callback */
void ah_open_luv(lua_State *L) {
  ah_st(L)->lazy_resource = ah_luv_resource;
  ah_add_funcs(L, luv_funcs);
}
