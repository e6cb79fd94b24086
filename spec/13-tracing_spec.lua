-- examples/tracing.lua: W3C trace context across two luv HTTP servers and
-- span trees from createHook.  The servers run in this process; 50
-- concurrent requests must each keep their own trace in every log line, in
-- the traceparent the upstream received and in their span tree.
require("luv") -- on the main thread, before anything else
local ah = require("async_hooks")
local H = require("helpers")
package.path = "examples/?.lua;" .. package.path
local T = require("tracing")

local TID = "4bf92f3577b34da6a3ce929d0e0e4736"
local SID = "00f067aa0ba902b7"

local function count_by_name(root)
  local n, all = {}, {}
  local function walk(s)
    for _, c in ipairs(s.children) do
      n[c.name] = (n[c.name] or 0) + 1
      all[#all + 1] = c
      walk(c)
    end
  end
  walk(root)
  return n, all
end

describe("W3C traceparent helpers", function()
  it("parse a valid version-00 header", function()
    local h = "00-" .. TID .. "-" .. SID .. "-01"
    assert.same({ version = "00", trace_id = TID, parent_id = SID, flags = "01", sampled = true }, T.parse(h))
    assert.is_false(T.parse("00-" .. TID .. "-" .. SID .. "-00").sampled)
    assert.equal(TID, T.parse("  " .. h .. "\t").trace_id) -- optional whitespace around
    assert.is_true(T.valid(h))
  end)

  local bad = {
    { "no header", nil, "no header" },
    { "empty", "", "malformed" },
    { "garbage", "hello world", "malformed" },
    { "binary garbage", "\0\255-\1-\2-\3", "malformed" },
    { "version ff", "ff-" .. TID .. "-" .. SID .. "-01", "version ff is invalid" },
    { "version not hex", "0g-" .. TID .. "-" .. SID .. "-01", "malformed" },
    { "version of one digit", "0-" .. TID .. "-" .. SID .. "-01", "malformed" },
    { "version 00 with a fifth field", "00-" .. TID .. "-" .. SID .. "-01-extra", "version 00 has exactly 4 fields" },
    { "trace id too short", "00-" .. TID:sub(2) .. "-" .. SID .. "-01", "trace-id is not 32 hex digits" },
    { "trace id too long", "00-" .. TID .. "0-" .. SID .. "-01", "trace-id is not 32 hex digits" },
    { "parent id too short", "00-" .. TID .. "-" .. SID:sub(2) .. "-01", "parent-id is not 16 hex digits" },
    { "parent id too long", "00-" .. TID .. "-" .. SID .. "a-01", "parent-id is not 16 hex digits" },
    { "flags of one digit", "00-" .. TID .. "-" .. SID .. "-1", "malformed" },
    { "flags of three digits", "00-" .. TID .. "-" .. SID .. "-011", "version 00 has exactly 4 fields" },
    { "uppercase trace id", "00-" .. TID:upper() .. "-" .. SID .. "-01", "not lowercase hex" },
    { "uppercase parent id", "00-" .. TID .. "-" .. SID:upper() .. "-01", "not lowercase hex" },
    { "uppercase flags", "00-" .. TID .. "-" .. SID .. "-0A", "not lowercase hex" },
    { "all-zero trace id", "00-" .. ("0"):rep(32) .. "-" .. SID .. "-01", "trace-id is all zeros" },
    { "all-zero parent id", "00-" .. TID .. "-" .. ("0"):rep(16) .. "-01", "parent-id is all zeros" },
    { "a later version with junk glued on", "cc-" .. TID .. "-" .. SID .. "-01x", "malformed" },
    { "dashes only", "---", "malformed" },
  }
  for _, case in ipairs(bad) do
    it("reject: " .. case[1], function()
      local ctx, why = T.parse(case[2])
      assert.is_nil(ctx)
      assert.equal(case[3], why)
      assert.is_false(T.valid(case[2]))
    end)
  end

  it("a later version is read as far as version 00 goes (forward compatible)", function()
    local ctx = T.parse("cc-" .. TID .. "-" .. SID .. "-01-what-the-future-holds")
    assert.equal("cc", ctx.version)
    assert.equal(TID, ctx.trace_id)
    assert.equal(SID, ctx.parent_id)
    assert.is_true(ctx.sampled)
  end)

  it("format writes version 00 and refuses what parse would refuse", function()
    assert.equal("00-" .. TID .. "-" .. SID .. "-01", T.format(TID, SID))
    assert.equal("00-" .. TID .. "-" .. SID .. "-00", T.format(TID, SID, "00"))
    assert.matches("trace%-id is all zeros", select(2, pcall(T.format, ("0"):rep(32), SID)))
    assert.matches("not lowercase hex", select(2, pcall(T.format, TID:upper(), SID)))
    assert.matches("parent%-id is not 16 hex digits", select(2, pcall(T.format, TID, "abc")))
  end)

  it("random ids are lowercase hex of the size asked, never all zeros", function()
    for _ = 1, 100 do
      local t, s = T.random_hex(32), T.random_hex(16)
      assert.matches("^[0-9a-f]+$", t)
      assert.equal(32, #t)
      assert.equal(16, #s)
      assert.is_true(T.valid(T.format(t, s)))
    end
  end)

  it("a child keeps version 00 flags; of a later version only the sampled bit", function()
    assert.equal("03", T.start_request("x", "n", "00-" .. TID .. "-" .. SID .. "-03").flags)
    assert.equal("01", T.start_request("x", "n", "cc-" .. TID .. "-" .. SID .. "-ff").flags)
    assert.equal("00", T.start_request("x", "n", "cc-" .. TID .. "-" .. SID .. "-fe").flags)
    local fresh = T.start_request("x", "n", "garbage")
    assert.equal("01", fresh.flags)
    assert.is_nil(fresh.span.parent_id)
    assert.is_true(T.valid(T.format(fresh.trace_id, fresh.span.span_id)))
  end)
end)

describe("the tracing example", function()
  teardown(function() ah.uninstall() end)

  it("50 concurrent requests: logs, upstream traceparents and span trees stay with their request", function()
    local N = 50
    local r = T.run { requests = N }
    assert.equal(0, require("async_hooks.core").stats().active)
    -- every request answered, with the trace it should have
    local trace_of, front, up = {}, {}, {}
    for i = 1, N do
      local rid = ("r%02d"):format(i)
      local body = assert(r.answers[rid], rid)
      local tid, echoed = body:match("^trace=(%x+) upstream=(%S+)$")
      assert.truthy(tid, body)
      local incoming = T.parse(r.sent[rid].traceparent)
      if incoming then assert.equal(incoming.trace_id, tid) end
      assert.is_nil(trace_of[tid], "two requests share trace " .. tid)
      trace_of[tid] = rid
      trace_of[rid] = tid
      -- what the upstream echoed is the traceparent it received: this trace
      assert.equal(tid, T.parse(echoed).trace_id)
    end
    -- one complete front tree and one upstream tree per request
    assert.equal(2 * N, #r.trees)
    for _, root in ipairs(r.trees) do
      local byreq = root.service == "front" and front or up
      assert.is_nil(byreq[root.request], "two trees for " .. root.request)
      byreq[root.request] = root
      assert.is_true(root.complete)
      assert.equal(0, root.open)
    end
    for i = 1, N do
      local rid = ("r%02d"):format(i)
      local root = assert(front[rid], rid)
      local incoming = T.parse(r.sent[rid].traceparent)
      assert.equal("GET /item/" .. i, root.name)
      assert.equal(trace_of[rid], root.trace_id)
      assert.equal(incoming and incoming.parent_id, root.parent_id)
      -- the front tree holds exactly this request's spans
      local names, all = count_by_name(root)
      assert.same({ timer_start = 1, fs_open = 1, fs_write = 1, fs_close = 1, fs_unlink = 1,
        getaddrinfo = 1, ["GET upstream /stock"] = 1, tcp_connect = 1, read_start = 1 }, names)
      local out
      for _, s in ipairs(all) do
        assert.is_true(s.root == root)
        assert.is_true(s.start >= root.start and s.finish >= s.start, s.name)
        if s.attrs:match("path=") then
          assert.matches("^path=.*/" .. rid .. "%.log$", s.attrs)
        end
        if s.name == "tcp_connect" then
          assert.equal("host=127.0.0.1 port=" .. r.up_port, s.attrs)
          assert.equal("GET upstream /stock", s.parent.name)
        end
        if s.name == "read_start" then assert.equal("tcp_connect", s.parent.name) end
        if s.name == "getaddrinfo" then
          assert.equal("host=localhost service=" .. r.up_port, s.attrs)
        end
        if s.name == "GET upstream /stock" then out = s end
      end
      -- the upstream tree continues the trace from the front's outbound span
      local uroot = assert(up[rid], rid)
      assert.equal(root.trace_id, uroot.trace_id)
      assert.equal(out.span_id, uroot.parent_id)
      assert.same({ timer_start = 1 }, (count_by_name(uroot)))
    end
    -- every traceparent the upstream received: version 00, this request's
    -- trace, the span of this request's outbound call, the incoming flags
    assert.equal(N, #r.upstream)
    for _, u in ipairs(r.upstream) do
      local ctx = assert(T.parse(u.traceparent), u.traceparent)
      assert.equal("00", ctx.version)
      assert.equal(trace_of[u.request], ctx.trace_id)
      local outbound
      for _, c in ipairs(front[u.request].children) do
        if c.name == "GET upstream /stock" then outbound = c end
      end
      assert.equal(outbound.span_id, ctx.parent_id)
      assert.equal("01", ctx.flags)
    end
    -- every log line carries the trace of the request it was written for
    assert.equal(4 * N, #r.lines)
    for _, l in ipairs(r.lines) do
      local ctx = assert(l.ctx, l.line)
      local n = l.text:match("^GET /item/(%d+) ")
      local rid = n and ("r%02d"):format(tonumber(n)) or l.text:match("^(r%d%d) slept")
        or l.text:match("^upstream GET /stock/(r%d%d)$") or l.text:match("^(r%d%d): upstream answered")
      assert.truthy(rid, l.text)
      assert.equal(rid, ctx.request, l.line)
      assert.equal(trace_of[rid], ctx.trace_id, l.line)
      assert.equal(("[%s trace=%s span=%s] %s"):format(ctx.service, trace_of[rid], ctx.span.root.span_id, l.text),
        l.line)
      local echoed = l.text:match("upstream answered (%S+)$")
      if echoed then assert.equal(ctx.trace_id, T.parse(echoed).trace_id) end
    end
  end)

  it("bad incoming headers start a new trace, never crash", function()
    local headers = {
      "ff-" .. TID .. "-" .. SID .. "-01", "00-" .. TID .. "-" .. SID .. "-01-x",
      "00-" .. TID:sub(3) .. "-" .. SID .. "-01", "00-" .. TID .. "-" .. SID:sub(3) .. "-01",
      "00-" .. TID:upper() .. "-" .. SID .. "-01", "00-" .. ("0"):rep(32) .. "-" .. SID .. "-01",
      "00-" .. TID .. "-" .. ("0"):rep(16) .. "-01", "garbage", "",
      "00-" .. TID .. "-" .. SID .. "-01", -- the one good header, for contrast
    }
    local r = T.run { requests = #headers, headers = function(i) return { traceparent = headers[i] } end }
    local seen = {}
    for i = 1, #headers do
      local rid = ("r%02d"):format(i)
      local tid = assert(r.answers[rid], rid):match("^trace=(%x+) ")
      assert.is_true(T.valid(T.format(tid, SID)))
      assert.is_nil(seen[tid])
      seen[tid] = true
      if i < #headers then
        assert.are_not.equal(TID, tid, headers[i])
      else
        assert.equal(TID, tid)
      end
    end
    for _, root in ipairs(r.trees) do
      if root.service == "front" then
        local i = tonumber(root.request:sub(2))
        assert.equal(i == #headers and SID or nil, root.parent_id)
      end
    end
  end)

  it("runs as a script and prints the span trees", function()
    local out = H.lua_ok('arg = {[0] = "examples/tracing.lua", "2"}; loadfile("examples/tracing.lua")("2")')
    assert.matches("2 answers, 4 span trees, 8 log lines", out, 1, true)
    assert.matches("\nGET /item/1  %[span %x+%]%s+%+%s*0%.00 +[%d.]+ ms\n  timer_start ", out)
    assert.matches("\n  GET upstream /stock  %[span %x+%] ", out)
    assert.matches("\n    tcp_connect  host=127%.0%.0%.1 port=%d+ ", out)
    assert.matches("\n      read_start ", out)
    assert.matches("\n  fs_open  path=[^\n]*/r01%.log ", out)
    assert.matches("upstream r02  %(parent span %x+%)", out)
  end)
end)
