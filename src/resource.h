/*
** resource.h - what AsyncResource needs of the core: ids, its init and
** destroy, GC tokens.
*/
#ifndef AH_RESOURCE_H
#define AH_RESOURCE_H

#include "ah.h"

/* the GC token metatable, the AsyncResource functions */
void ah_open_resource(lua_State *L);

#endif
