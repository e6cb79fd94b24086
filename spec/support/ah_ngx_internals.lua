-- The OpenResty spec's check of the backend's one dependency on
-- lua-resty-core's and ngx_lua's undocumented parts
-- (async_hooks.backend.ngx_private): each internal read is the one in use
-- and means what the backend takes it to mean.  Added to ah_ngx_app's
-- table.
local ngx = ngx
local P = require("async_hooks.backend.ngx_private")
local concat, tostring = table.concat, tostring

local function s(v) return tostring(v) end

return function(A)
  --- the internal reads in use; a request's ctx peeked before it exists,
  --- once made, once replaced; the phase's number; a timer's fake request
  --- (its ctx made by assignment, as the backend's trampoline does)
  function A.internals()
    local r = P.get_request()
    local out = { s(P.internal.ctx), s(P.internal.phase), s(r ~= nil), s(P.peek_ctx(r)) }
    local c = ngx.ctx
    c.x = 1
    out[#out + 1] = s(rawequal(P.peek_ctx(r), c))
    local c2 = {}
    ngx.ctx = c2
    out[#out + 1] = s(rawequal(P.peek_ctx(r), c2))
    out[#out + 1] = s(P.phase(r) == 0x0008 and not P.NESTED[P.phase(r)])
    local d = ngx.shared.ah
    d:delete("internals")
    ngx.timer.at(0, function()
      local tr = P.get_request()
      local before = P.peek_ctx(tr)
      local t = {}
      ngx.ctx = t
      d:set("internals", concat({ s(tr ~= nil), s(before), s(rawequal(P.peek_ctx(tr), t)),
        s(P.phase(tr) == 0x0080) }, " "))
    end)
    for _ = 1, 200 do
      if d:get("internals") then break end
      ngx.sleep(0.002)
    end
    out[#out + 1] = s(d:get("internals"))
    ngx.say(concat(out, " "))
  end

  --- a nested phase's number is in NESTED
  function A.internals_header_filter()
    ngx.header["X-Nested"] = s(P.NESTED[P.phase(P.get_request())] == true)
  end
end
