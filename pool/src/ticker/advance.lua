-- Claim the current tick of a distributed ticker (flotilla-pool, ticker.rs).
--
-- KEYS[1]  the ticker's state: the last slot ticked (string)
-- ARGV[1]  interval, milliseconds
--
-- slot = floor(server_now_ms / interval). The caller that moves the stored
-- slot forward owns the tick; everyone else in the same slot gets 0, so a
-- slot is ticked at most once pool-wide.
--
-- Returns  {1, slot, now_ms}   this caller owns the tick of `slot`
--          {0, slot, now_ms}   `slot` was already ticked (or is behind)
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local interval = tonumber(ARGV[1])
local slot = math.floor(now / interval)
local last = tonumber(redis.call('GET', KEYS[1]) or '-1')
if last >= slot then
  return {0, slot, now}
end
redis.call('SET', KEYS[1], string.format('%.0f', slot), 'PX',
  string.format('%.0f', math.max(interval * 10, 60000)))
return {1, slot, now}
