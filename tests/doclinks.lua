-- The links of the LDoc reference (`make docs`), both ways.
--
--   lua5.4 tests/doclinks.lua prep config.ld ROCKSPEC
--     writes the Markdown copies that config.ld's `topics` name
--     (build/docs-src/<path> for the source <path>) with their links
--     rewritten for the HTML, which keeps every topic in topics/<name>.html
--     and every example in examples/<name>.html: a link to a topic goes to
--     its page, a link to a rendered example to its page, a link to any
--     other file of the repository to that file at the release's tag on the
--     project's home (ROCKSPEC's description.homepage and source.tag).
--     Before each heading it puts an anchor named as GitHub names the
--     heading, so that `file.md#heading` links keep their fragment.  It
--     also writes what LDoc's Markdown pass would misread the way GitHub
--     reads it: a blank line before each heading (a heading ends a list),
--     three spaces for a list item's continuation lines (LDoc takes lines
--     indented by four for code), plain fences for code that is not Lua
--     (LDoc colours all fenced code as Lua).  Fails when a link of the
--     Markdown points at no file of the repository.
--   lua5.4 tests/doclinks.lua check PAGE.html...
--     fails on a local link (href) of the pages that resolves to no file,
--     or to a file without the named anchor.
--
-- The Markdown sources stay as they are, with links that work on GitHub.
local PREFIX = "build/docs-src/"

local function readfile(path)
  local f = io.open(path, "rb")
  if not f then return nil end
  local s = f:read("a")
  f:close()
  return s
end

local function exists(path)
  local f = io.open(path, "rb")
  if f then f:close() end
  return f ~= nil
end

local function dirname(path) return path:match("^(.*)/[^/]*$") or "" end
local function basename(path) return path:match("([^/]*)$") end

-- `path` relative to the folder `dir`, "." and ".." removed; nil when it
-- leaves the root
local function join(dir, path)
  local parts = {}
  for p in ((dir ~= "" and dir .. "/" or "") .. path):gmatch("[^/]+") do
    if p == ".." then
      if #parts == 0 then return nil end
      parts[#parts] = nil
    elseif p ~= "." then
      parts[#parts + 1] = p
    end
  end
  return table.concat(parts, "/")
end

local failures = 0
local function fail(fmt, ...)
  io.stderr:write(("doclinks: " .. fmt .. "\n"):format(...))
  failures = failures + 1
end

-- The fragment GitHub gives a heading: its text without Markdown, lower
-- case, punctuation other than '-' and '_' dropped, spaces as '-'; a
-- repeated one gets -1, -2, ...
local function slug(text, seen)
  local s = text:gsub("%[([^]]*)%]%b()", "%1"):gsub("[`*]", ""):lower()
  s = s:gsub("[^%w%s_%-\128-\255]", ""):gsub("%s", "-")
  local n = seen[s]
  seen[s] = (n or -1) + 1
  if n then return s .. "-" .. (n + 1) end
  return s
end

local function prep(config, rockspec)
  local cfg = {}
  assert(load(assert(readfile(config), config), "@" .. config, "t", cfg))()
  local spec = {}
  assert(load(assert(readfile(rockspec), rockspec), "@" .. rockspec, "t", spec))()
  local home = assert(spec.description and spec.description.homepage, "rockspec: no homepage")
  local tag = assert(spec.source and spec.source.tag, "rockspec: no source.tag")

  -- the source of each topic, by its page; the examples' pages
  local page = {}
  local sources = {}
  for _, t in ipairs(cfg.topics) do
    assert(t:sub(1, #PREFIX) == PREFIX, config .. ": topic not under " .. PREFIX .. ": " .. t)
    local src = t:sub(#PREFIX + 1)
    if page[basename(src)] then error(config .. ": two topics named " .. basename(src)) end
    page[basename(src)] = true
    page[src] = basename(src) .. ".html"
    sources[#sources + 1] = src
  end
  for _, e in ipairs(cfg.examples or {}) do page[e] = "../examples/" .. basename(e) .. ".html" end

  local function target(src, link)
    if link:match("^%a[%w+.-]*:") or link:sub(1, 1) == "#" then return link end
    local path, frag = link:match("^([^#]*)(.*)$")
    local full = join(dirname(src), path)
    if not full or not exists(full == "" and "." or full) then
      fail("%s: link to no file of the repository: %s", src, link)
      return link
    end
    if page[full] then return page[full] .. frag end
    local kind = path:sub(-1) == "/" and "/tree/" or "/blob/"
    return home .. kind .. tag .. "/" .. full .. frag
  end

  for _, src in ipairs(sources) do
    local out, seen, fence, code = {}, {}, nil, false
    local plain_end -- where the last plain fenced block ended in out
    for line in (assert(readfile(src), src) .. "\n"):gmatch("(.-)\r?\n") do
      local f = line:match("^%s*(```+)") or line:match("^%s*(~~~+)")
      if fence then
        if f and f:sub(1, 1) == fence[1]:sub(1, 1) and #f >= #fence[1] then
          if fence.plain then plain_end = #out + 1 end
          fence = nil
        end
      elseif f then
        -- LDoc colours every fenced block as Lua: other languages go plain
        local lang = line:match("^%s*[`~]+%s*(%S*)")
        if lang ~= "" and lang ~= "lua" then line = line:match("^%s*") .. f end
        fence = { f, plain = lang ~= "lua" }
        -- LDoc indents a plain block for discount, which would join it to
        -- a plain block just before it
        if fence.plain and plain_end and not table.concat(out, "", plain_end + 1):match("%S") then
          out[#out + 1] = "<!-- -->"
          out[#out + 1] = ""
        end
      else
        -- LDoc takes every line indented by four or more for code; in
        -- Markdown such a line right after a paragraph's line continues it
        -- (a list item's text): give it three spaces, the same paragraph
        local indent = #line:match("^ *")
        local prev = out[#out] or ""
        if indent >= 4 and prev:match("%S") and not code then
          line = "   " .. line:sub(indent + 1)
        else
          code = indent >= 4 and (code or not prev:match("%S"))
        end
        local heading = line:match("^#+%s+(.-)%s*#*%s*$")
        if heading then
          -- a heading ends a list or paragraph on GitHub, not in discount
          if #out > 0 and out[#out]:match("%S") then out[#out + 1] = "" end
          out[#out + 1] = ('<a name="%s"></a>'):format(slug(heading, seen))
        end
        line = line:gsub("(%]%()([^)%s]+)(%))", function(a, link, b) return a .. target(src, link) .. b end)
      end
      out[#out + 1] = line
    end
    local dest = PREFIX .. src
    os.execute(("mkdir -p '%s'"):format(dirname(dest)))
    local f = assert(io.open(dest, "wb"))
    f:write(table.concat(out, "\n"), "\n")
    f:close()
  end
end

local function check(pages)
  local anchors = {}
  local function has_anchor(path, name)
    if not anchors[path] then
      local set, html = {}, readfile(path)
      for n in html:gmatch('<a%s+name%s*=%s*"([^"]*)"') do set[n] = true end
      for n in html:gmatch('%sid="([^"]*)"') do set[n] = true end
      anchors[path] = set
    end
    return anchors[path][name]
  end
  local links = 0
  for _, p in ipairs(pages) do
    local html = assert(readfile(p), p)
    for href in html:gmatch('href="([^"]*)"') do
      if not href:match("^%a[%w+.-]*:") then
        links = links + 1
        local path, frag = href:match("^([^#]*)#?(.*)$")
        local full = path == "" and p or join(dirname(p), path)
        if not full or not exists(full) or readfile(full) == nil then
          fail("%s: dangling link %s", p, href)
        elseif frag ~= "" and full:match("%.html$") and not has_anchor(full, frag) then
          fail("%s: link %s: no anchor '%s' in %s", p, href, frag, full)
        end
      end
    end
  end
  print(("doclinks: %d local links in %d pages"):format(links, #pages))
end

local cmd = arg[1]
if cmd == "prep" and arg[3] then
  prep(arg[2], arg[3])
elseif cmd == "check" and arg[2] then
  check({ table.unpack(arg, 2) })
else
  io.stderr:write("usage: lua5.4 tests/doclinks.lua prep CONFIG ROCKSPEC | check PAGE.html...\n")
  os.exit(2)
end
if failures > 0 then os.exit(1) end
