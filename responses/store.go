package responses

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/warmpath/warmpath/internal/chatapi"
)

// store keeps responses, items, conversations and background event
// buffers in Redis. Every key of one tenant carries the tenant's hash tag,
// so the multi-key scripts below stay in one cluster slot.
type store struct {
	rdb     redis.UniversalClient
	prefix  string
	ttl     time.Duration
	convTTL time.Duration
	evTTL   time.Duration
}

// errNotFound is a missing (unknown, expired, deleted or other-tenant)
// response, item or conversation.
var errNotFound = errors.New("responses: not found")

// errBrokenChain is a chain whose ancestor has expired or was deleted.
var errBrokenChain = errors.New("responses: an earlier response of the chain is gone")

// errLocked is a conversation held by another turn.
var errLocked = errors.New("responses: conversation is locked by another turn")

// errCancelled is a background response cancelled while it ran.
var errCancelled = errors.New("responses: response was cancelled")

var plainTenant = regexp.MustCompile(`^[A-Za-z0-9_.:-]{0,64}$`)

// tag is the tenant's hash tag: the tenant itself when it is short and
// plain, else a digest, so no tenant can break out of its braces.
func tag(tenant string) string {
	if plainTenant.MatchString(tenant) {
		return "{t" + tenant + "}"
	}
	sum := sha256.Sum256([]byte(tenant))
	return "{h" + hex.EncodeToString(sum[:16]) + "}"
}

func (s *store) respPrefix(t string) string { return s.prefix + "resp:" + tag(t) + ":" }
func (s *store) itemPrefix(t string) string { return s.prefix + "item:" + tag(t) + ":" }
func (s *store) recKey(t, id string) string { return s.respPrefix(t) + id }
func (s *store) itemKey(t, id string) string {
	return s.itemPrefix(t) + id
}
func (s *store) convKey(t, id string) string      { return s.prefix + "conv:" + tag(t) + ":" + id }
func (s *store) convItemsKey(t, id string) string { return s.prefix + "convitems:" + tag(t) + ":" + id }
func (s *store) lockKey(t, id string) string      { return s.prefix + "convlock:" + tag(t) + ":" + id }
func (s *store) eventsKey(t, id string) string    { return s.prefix + "ev:" + tag(t) + ":" + id }
func (s *store) jobsKey() string                  { return s.prefix + "resp:jobs" }
func (s *store) leasesKey() string                { return s.prefix + "resp:leases" }
func (s *store) cancelChannel() string            { return s.prefix + "resp:cancel" }

// Record fields of a stored response (HASH <prefix>resp:{tag}:<id>).
const (
	fObj    = "obj"    // the Response JSON (status and error overlaid from fStatus, fErr)
	fIn     = "in"     // this turn's input items, a JSON array, references resolved
	fMsgs   = "msgs"   // this turn's input and output as chat messages, comma-joined
	fPrev   = "prev"   // previous_response_id, "" at a chain root
	fSess   = "sess"   // the chain's session key
	fIDs    = "ids"    // JSON array of the item IDs this turn indexed
	fStatus = "status" // the authoritative status
	fErr    = "err"    // the error JSON of a failed response
	fBG     = "bg"     // "1" for a background response
	fBody   = "body"   // a background response's request body
	fHdr    = "hdr"    // a background response's client headers, JSON
	fLease  = "lease"  // a running background response's lease deadline, unix ms
	fCancel = "cancel" // "1" once cancellation was asked
)

// chainScript walks previous_response_id links from KEYS[1] in one round
// trip, refreshing each record's TTL. It returns {0} when KEYS[1] is
// missing, {-1} when an ancestor is, {-2} past ARGV[2] hops, else
// {1, session key, status of KEYS[1], msgs newest first…}.
var chainScript = redis.NewScript(`
local key = KEYS[1]
local out = {1, false, false}
local n = 0
while true do
  local v = redis.call('HMGET', key, 'msgs', 'prev', 'sess', 'status')
  if not v[4] then
    if n == 0 then return {0} end
    return {-1}
  end
  if n == 0 then out[2] = v[3] or ''; out[3] = v[4] end
  out[#out + 1] = v[1] or ''
  if tonumber(ARGV[3]) > 0 then redis.call('PEXPIRE', key, ARGV[3]) end
  n = n + 1
  if not v[2] or v[2] == '' then return out end
  if n >= tonumber(ARGV[2]) then return {-2} end
  key = ARGV[1] .. v[2]
end
`)

// maxChainHops bounds a chain walk, so a corrupted cycle cannot spin.
const maxChainHops = 100000

// chain returns the chat messages of every turn of the chain ending at id,
// oldest first, the chain's session key, and id's status.
func (s *store) chain(ctx context.Context, tenant, id string) (msgs [][]byte, sess, status string, err error) {
	res, err := chainScript.Run(ctx, s.rdb, []string{s.recKey(tenant, id)},
		s.respPrefix(tenant), maxChainHops, s.ttl.Milliseconds()).Slice()
	if err != nil {
		return nil, "", "", fmt.Errorf("responses: read chain of %s: %w", id, err)
	}
	switch code, _ := res[0].(int64); code {
	case 0:
		return nil, "", "", errNotFound
	case -1:
		return nil, "", "", errBrokenChain
	case -2:
		return nil, "", "", fmt.Errorf("responses: chain of %s exceeds %d turns", id, maxChainHops)
	}
	sess, _ = res[1].(string)
	status, _ = res[2].(string)
	for i := len(res) - 1; i >= 3; i-- {
		if m, _ := res[i].(string); m != "" {
			msgs = append(msgs, []byte(m))
		}
	}
	return msgs, sess, status, nil
}

// storedItem is an item found by ID, with the session key of the turn
// that stored it.
type storedItem struct {
	Item Item
	Sess string
}

// items looks items up by ID in one pipelined round trip; missing IDs are
// absent from the map.
func (s *store) items(ctx context.Context, tenant string, ids []string) (map[string]storedItem, error) {
	if len(ids) == 0 {
		return nil, nil
	}
	pipe := s.rdb.Pipeline()
	cmds := make([]*redis.SliceCmd, len(ids))
	for i, id := range ids {
		cmds[i] = pipe.HMGet(ctx, s.itemKey(tenant, id), "j", "k")
	}
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return nil, fmt.Errorf("responses: look up items: %w", err)
	}
	found := make(map[string]storedItem, len(ids))
	for i, c := range cmds {
		v := c.Val()
		j, _ := v[0].(string)
		if j == "" {
			continue
		}
		it, err := decodeItem([]byte(j))
		if err != nil {
			return nil, fmt.Errorf("responses: decode item %s: %w", ids[i], err)
		}
		k, _ := v[1].(string)
		found[ids[i]] = storedItem{Item: it, Sess: k}
	}
	return found, nil
}

// decodeItem reads back an item this package marshalled.
func decodeItem(b []byte) (Item, error) {
	var r rawItem
	if err := json.Unmarshal(b, &r); err != nil {
		return Item{}, err
	}
	it, err := parseItem(b, "item")
	if err != nil {
		return Item{}, err
	}
	it.ID, it.Status = r.ID, r.Status
	return it, nil
}

// record is what commit writes for one response.
type record struct {
	tenant string
	resp   *Response
	input  []Item
	output []Item
	msgs   []byte
	prev   string
	sess   string
	// conversation, when set, gets input and output appended, under the
	// lock token lock.
	conversation, lock string
	// requireRunning makes commit fail with errCancelled unless the record
	// is in progress (background runs).
	requireRunning bool
}

// commitScript writes one finished response atomically:
// KEYS = {record, conversation, conversation items, lock, item keys…};
// ARGV = {ttl ms, conversation ttl ms, lock token ("" = none),
// require running ("1"/""), record field/value count, fields…, item
// values (json, session) per item key, conversation item IDs…}.
var commitScript = redis.NewScript(`
local ttl, cttl, lock, running = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
if running == '1' and redis.call('HGET', KEYS[1], 'status') ~= 'in_progress' then
  return 'cancelled'
end
if lock ~= '' then
  if redis.call('GET', KEYS[4]) ~= lock then return 'locklost' end
  if redis.call('EXISTS', KEYS[2]) == 0 then return 'noconv' end
end
local nf = tonumber(ARGV[5])
local a = 6
local fields = {}
for i = 1, nf * 2 do fields[i] = ARGV[a]; a = a + 1 end
redis.call('HSET', KEYS[1], unpack(fields))
redis.call('HDEL', KEYS[1], 'body', 'lease')
redis.call('PEXPIRE', KEYS[1], ttl)
for k = 5, #KEYS do
  redis.call('HSET', KEYS[k], 'j', ARGV[a], 'k', ARGV[a + 1], 'r', ARGV[a + 2])
  a = a + 3
  redis.call('PEXPIRE', KEYS[k], lock ~= '' and cttl or ttl)
end
if lock ~= '' then
  local ids = {}
  for i = a, #ARGV do ids[#ids + 1] = ARGV[i] end
  if #ids > 0 then redis.call('RPUSH', KEYS[3], unpack(ids)) end
  redis.call('PEXPIRE', KEYS[2], cttl)
  redis.call('PEXPIRE', KEYS[3], cttl)
end
return 'ok'
`)

// commit stores a finished response, its items and (for a conversation
// turn) the conversation's new items in one atomic script.
func (s *store) commit(ctx context.Context, r *record) error {
	obj, err := chatapi.Marshal(r.resp)
	if err != nil {
		return fmt.Errorf("responses: encode %s: %w", r.resp.ID, err)
	}
	in, err := chatapi.Marshal(nonNilItems(r.input))
	if err != nil {
		return fmt.Errorf("responses: encode input of %s: %w", r.resp.ID, err)
	}
	all := append(slices.Clone(r.input), r.output...)
	ids := make([]string, len(all))
	for i, it := range all {
		ids[i] = it.ID
	}
	idsJSON, _ := chatapi.Marshal(ids)
	errJSON := ""
	if r.resp.Error != nil {
		b, _ := chatapi.Marshal(r.resp.Error)
		errJSON = string(b)
	}
	fields := []any{fObj, obj, fIn, in, fMsgs, r.msgs, fPrev, r.prev, fSess, r.sess, fIDs, idsJSON,
		fStatus, r.resp.Status, fErr, errJSON}
	keys := []string{s.recKey(r.tenant, r.resp.ID), "", "", ""}
	if r.conversation != "" {
		keys[1], keys[2], keys[3] = s.convKey(r.tenant, r.conversation), s.convItemsKey(r.tenant, r.conversation), s.lockKey(r.tenant, r.conversation)
	} else {
		keys[1], keys[2], keys[3] = keys[0], keys[0], keys[0] // unused; same slot
	}
	running := ""
	if r.requireRunning {
		running = "1"
	}
	args := []any{s.ttl.Milliseconds(), s.convTTL.Milliseconds(), r.lock, running, len(fields) / 2}
	args = append(args, fields...)
	for _, it := range all {
		j, err := chatapi.Marshal(it)
		if err != nil {
			return fmt.Errorf("responses: encode item %s: %w", it.ID, err)
		}
		keys = append(keys, s.itemKey(r.tenant, it.ID))
		owner := r.resp.ID
		if r.conversation != "" {
			owner = r.conversation
		}
		args = append(args, j, r.sess, owner)
	}
	if r.conversation != "" {
		for _, id := range ids {
			args = append(args, id)
		}
	}
	res, err := commitScript.Run(ctx, s.rdb, keys, args...).Text()
	if err != nil {
		return fmt.Errorf("responses: store %s: %w", r.resp.ID, err)
	}
	switch res {
	case "ok":
		return nil
	case "cancelled":
		return errCancelled
	case "locklost":
		return fmt.Errorf("responses: store %s: %w (the turn outlived its lock)", r.resp.ID, errLocked)
	case "noconv":
		return fmt.Errorf("responses: store %s: conversation %s: %w", r.resp.ID, r.conversation, errNotFound)
	}
	return fmt.Errorf("responses: store %s: unexpected reply %q", r.resp.ID, res)
}

func nonNilItems(items []Item) []Item {
	if items == nil {
		return []Item{}
	}
	return items
}

// stored is a response record as read back.
type stored struct {
	resp   *Response
	input  []Item
	ids    []string
	bg     bool
	body   []byte
	header map[string][]string
	cancel bool
}

// get reads a stored response; errNotFound when absent.
func (s *store) get(ctx context.Context, tenant, id string, withInput bool) (*stored, error) {
	fields := []string{fObj, fStatus, fErr, fBG, fIDs, fCancel, fBody, fHdr}
	if withInput {
		fields = append(fields, fIn)
	}
	v, err := s.rdb.HMGet(ctx, s.recKey(tenant, id), fields...).Result()
	if err != nil {
		return nil, fmt.Errorf("responses: read %s: %w", id, err)
	}
	obj, _ := v[0].(string)
	if obj == "" {
		return nil, errNotFound
	}
	st := &stored{resp: new(Response)}
	if err := json.Unmarshal([]byte(obj), st.resp); err != nil {
		return nil, fmt.Errorf("responses: decode %s: %w", id, err)
	}
	if status, _ := v[1].(string); status != "" {
		st.resp.Status = status
	}
	if e, _ := v[2].(string); e != "" {
		st.resp.Error = new(ResponseError)
		_ = json.Unmarshal([]byte(e), st.resp.Error)
	}
	st.bg = v[3] == "1"
	if ids, _ := v[4].(string); ids != "" {
		_ = json.Unmarshal([]byte(ids), &st.ids)
	}
	st.cancel = v[5] == "1"
	if b, _ := v[6].(string); b != "" {
		st.body = []byte(b)
	}
	if h, _ := v[7].(string); h != "" {
		_ = json.Unmarshal([]byte(h), &st.header)
	}
	if withInput {
		if in, _ := v[8].(string); in != "" {
			if st.input, err = decodeItems([]byte(in)); err != nil {
				return nil, fmt.Errorf("responses: decode input of %s: %w", id, err)
			}
		}
	}
	return st, nil
}

func decodeItems(b []byte) ([]Item, error) {
	var raws []json.RawMessage
	if err := json.Unmarshal(b, &raws); err != nil {
		return nil, err
	}
	items := make([]Item, 0, len(raws))
	for _, r := range raws {
		it, err := decodeItem(r)
		if err != nil {
			return nil, err
		}
		items = append(items, it)
	}
	return items, nil
}

// UnmarshalJSON lets stored Responses round-trip through Item's custom
// encoding.
func (it *Item) UnmarshalJSON(b []byte) error {
	v, err := decodeItem(b)
	if err != nil {
		return err
	}
	*it = v
	return nil
}

// remove deletes a response record, its indexed items and its event
// buffer; errNotFound when it is absent.
func (s *store) remove(ctx context.Context, tenant, id string) error {
	st, err := s.get(ctx, tenant, id, false)
	if err != nil {
		return err
	}
	keys := []string{s.recKey(tenant, id), s.eventsKey(tenant, id)}
	for _, iid := range st.ids {
		keys = append(keys, s.itemKey(tenant, iid))
	}
	// Delete the items only where this response still owns them: a later
	// turn may have re-stored the same item ID.
	pipe := s.rdb.Pipeline()
	pipe.Del(ctx, keys[:2]...)
	pipe.ZRem(ctx, s.leasesKey(), s.recKey(tenant, id))
	if _, err := pipe.Exec(ctx); err != nil {
		return fmt.Errorf("responses: delete %s: %w", id, err)
	}
	if len(keys) > 2 {
		if err := deleteOwnedScript.Run(ctx, s.rdb, keys[2:], id).Err(); err != nil && !errors.Is(err, redis.Nil) {
			return fmt.Errorf("responses: delete items of %s: %w", id, err)
		}
	}
	return nil
}

// deleteOwnedScript deletes the item keys whose owner field is ARGV[1].
var deleteOwnedScript = redis.NewScript(`
for _, k in ipairs(KEYS) do
  if redis.call('HGET', k, 'r') == ARGV[1] then redis.call('DEL', k) end
end
return 0
`)

func ms(t time.Time) string { return strconv.FormatInt(t.UnixMilli(), 10) }
