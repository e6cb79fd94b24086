/*
** interpose.c - a stand-in for a C method of another library (cqueues'
** controller methods), through which the original keeps its own argument
** errors: messages, argument numbers, names and positions.
**
** interpose(orig, mt, impl, post) -> stand-in.  orig: a C function with at
** most IP_MAXUP upvalues.  The stand-in is a C closure whose first
** upvalues are copies of orig's, so that orig runs in the stand-in's own
** frame (orig reads its upvalues through the running closure): Lua names
** the call as it names the stand-in's, as it would name orig's.  A call
** whose first argument has the metatable mt and whose second is a
** function goes to impl (a Lua function, given every argument); any other
** call to orig itself, whose checks raise what they raise without the
** library.  post (or nil) is called with no arguments after orig
** returns, its results kept.  mt = nil: every call goes to orig.
** orig's C function and its upvalues are kept in a record the debug
** library cannot forge (a userdata that points to itself); each call to
** orig checks that the stand-in's first upvalues are still those, so that
** orig never runs with values it was not given.
*/
#include "interpose.h"
#include "base.h"

#define IP_MAXUP 8 /* upvalues of orig copied (the rest nil, as for orig) */
#define IP_REC lua_upvalueindex(IP_MAXUP + 1)
#define IP_MT lua_upvalueindex(IP_MAXUP + 2)
#define IP_IMPL lua_upvalueindex(IP_MAXUP + 3)
#define IP_POST lua_upvalueindex(IP_MAXUP + 4)
#define IP_NUP (IP_MAXUP + 4)

/* orig, and (its user values) its upvalues */
typedef struct ip_rec {
  const void *self;
  lua_CFunction f;
  int nup;
} ip_rec;

/* the record, if it is one and the stand-in's first upvalues are still
** orig's; else NULL */
static const ip_rec *checked(lua_State *L) {
  const ip_rec *r = (const ip_rec *)ah_testself(L, IP_REC, sizeof(ip_rec));
  int i, same = 1;
  if (r == NULL || !lua_checkstack(L, 1)) return NULL;
  for (i = 1; same && i <= r->nup; i++) {
    lua_getiuservalue(L, IP_REC, i);
    same = lua_rawequal(L, -1, lua_upvalueindex(i));
    lua_pop(L, 1);
  }
  return same ? r : NULL;
}

static int stand_in(lua_State *L) {
  const ip_rec *r;
  int n;
  if (lua_type(L, IP_MT) == LUA_TTABLE && lua_type(L, 2) == LUA_TFUNCTION &&
      lua_type(L, IP_IMPL) == LUA_TFUNCTION && lua_getmetatable(L, 1)) {
    int same = lua_rawequal(L, -1, IP_MT);
    lua_pop(L, 1);
    if (same) {
      n = lua_gettop(L);
      luaL_checkstack(L, 1, "async_hooks");
      lua_pushvalue(L, IP_IMPL);
      lua_insert(L, 1);
      lua_call(L, n, LUA_MULTRET);
      return lua_gettop(L);
    }
  }
  /* (the debug library can change the upvalues) */
  if ((r = checked(L)) == NULL)
    return luaL_error(L, "async_hooks: internal state damaged (interpose)");
  n = r->f(L); /* its results: the top n values, kept above post's call */
  if (lua_type(L, IP_POST) == LUA_TFUNCTION) {
    luaL_checkstack(L, 1, "async_hooks");
    lua_pushvalue(L, IP_POST);
    lua_call(L, 0, 0);
  }
  return n;
}

static int l_interpose(lua_State *L) {
  lua_CFunction orig = lua_tocfunction(L, 1);
  ip_rec *r;
  int i, nup = 0;
  luaL_argexpected(L, orig != NULL, 1, "C function");
  if (!lua_isnoneornil(L, 2)) luaL_checktype(L, 2, LUA_TTABLE);
  luaL_checktype(L, 3, LUA_TFUNCTION);
  if (!lua_isnoneornil(L, 4)) luaL_checktype(L, 4, LUA_TFUNCTION);
  lua_settop(L, 4);
  luaL_checkstack(L, IP_NUP + 2, "async_hooks");
  while (lua_getupvalue(L, 1, nup + 1) != NULL)
    if (++nup > IP_MAXUP) return 0; /* too many: nothing (the caller's
                                    ** fallback) */
  lua_settop(L, 4);
  r = (ip_rec *)lua_newuserdatauv(L, sizeof(ip_rec), nup); /* 5 */
  r->self = r;
  r->f = orig;
  r->nup = nup;
  ah_internal_mt(L, 5);
  for (i = 1; i <= nup; i++) {
    lua_getupvalue(L, 1, i);
    lua_setiuservalue(L, 5, i);
  }
  for (i = 1; i <= nup; i++) lua_getupvalue(L, 1, i);
  for (i = nup; i < IP_MAXUP; i++) lua_pushnil(L);
  lua_pushvalue(L, 5);
  lua_pushvalue(L, 2);
  lua_pushvalue(L, 3);
  lua_pushvalue(L, 4);
  lua_pushcclosure(L, stand_in, IP_NUP);
  return 1;
}

/* thread_push(co, ...): the values go onto the stack of co, a coroutine
** that has not started, above its function: what a scheduler that starts
** a thread with its stack's values as arguments (cqueues) then passes */
static int l_thread_push(lua_State *L) {
  lua_State *co = lua_tothread(L, 1);
  lua_Debug ar;
  int n = lua_gettop(L) - 1;
  luaL_argexpected(L, co != NULL && co != L, 1, "coroutine");
  luaL_argcheck(L, lua_status(co) == LUA_OK && !lua_getstack(co, 0, &ar) &&
                   lua_gettop(co) == 1, 1, "a coroutine that has not started");
  if (!lua_checkstack(co, n)) return luaL_error(L, "too many arguments");
  lua_xmove(L, co, n);
  return 0;
}

static const luaL_Reg interpose_funcs[] = {
  {"interpose", l_interpose},
  {"thread_push", l_thread_push},
  {NULL, NULL}
};

/* module table on top */
void ah_open_interpose(lua_State *L) {
  ah_add_funcs(L, interpose_funcs);
}
