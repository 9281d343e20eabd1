-- Removes the idempotency marker written by one admission whose start the
-- handler refused, so the key may be dispatched again at once.
-- KEYS[1] the key's idempotency marker ("<admitted_ms> <token>")
-- ARGV[1] the refused admission's fencing token
-- Returns 1 when removed, 0 when the marker is gone or belongs to another
-- admission.
local marker = redis.call('GET', KEYS[1])
if marker and string.match(marker, ' (%d+)$') == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
