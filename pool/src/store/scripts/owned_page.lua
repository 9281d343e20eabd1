-- One page of the jobs hash (HSCAN cursor) filtered by owner: the keys a
-- worker owns, read from Redis rather than a node's replica (which may be
-- stale after a restart). The caller moves each with `handoff.lua`, which
-- checks the owner again; a key listed twice (HSCAN may repeat one) is
-- moved once.
-- KEYS: base
-- ARGV: base, 4 cursor, 5 page size (HSCAN COUNT), 6 worker id
-- Returns {cursor, key...}; a record that does not parse is listed when its
-- first word is the worker (the hand-off reads only that part).
local page = redis.call('HSCAN', JOBS[1], ARGV[4], 'COUNT', tonumber(ARGV[5]))
local worker = ARGV[6]
local reply = {page[1]}
local fields = page[2]
for i = 1, #fields, 2 do
  if string.match(fields[i + 1], '^(%S+)') == worker then
    reply[#reply + 1] = fields[i]
  end
end
return reply
