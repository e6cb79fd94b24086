/*
** scope.h - the scope trampoline behind AsyncResource:runInAsyncScope and
** every bound function, and the hooks of a coroutine's open scopes.
*/
#ifndef AH_SCOPE_H
#define AH_SCOPE_H

#include "ah.h"

int ah_emit_as(lua_State *L, ah_state *st, int kind, lua_Integer id,
               lua_Integer trigger, int res_idx);
int ah_scopes_slice(lua_State *L, ah_state *st, int kind, int co_idx);
/* the guard metatable, enter_scope */
void ah_open_scope(lua_State *L);

#endif
