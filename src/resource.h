/*
** resource.h - what AsyncResource needs of the core: ids, its init and
** destroy, GC tokens.
*/
#ifndef AH_RESOURCE_H
#define AH_RESOURCE_H

#include "ah.h"

/* the resource at idx had its emitDestroy (emit_destroy was given it) */
int ah_resource_destroyed(lua_State *L, int idx);
/* the GC token metatable, the AsyncResource functions */
void ah_open_resource(lua_State *L);

#endif
