/*
** coro.h - the coroutine trampoline: module.coro.
*/
#ifndef AH_CORO_H
#define AH_CORO_H

#include "ah.h"

/* module.coro = {create, wrap, resume, close}, the "coroutine" type */
void ah_open_coro(lua_State *L);

#endif
