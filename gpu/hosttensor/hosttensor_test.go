package hosttensor

import (
	"encoding/binary"
	"math"
	"testing"

	"gorgonia.org/tensor"
)

// TestHostTensor also proves that a binary importing gorgonia.org/tensor
// starts on this Go release (assume-no-moving-gc panics at init otherwise).
func TestHostTensor(t *testing.T) {
	buf := make([]byte, 4*6)
	for i := range 6 {
		binary.NativeEndian.PutUint32(buf[4*i:], math.Float32bits(float32(i)))
	}
	d, err := HostTensor(buf, 2, 3)
	if err != nil {
		t.Fatal(err)
	}
	if !d.Shape().Eq(tensor.Shape{2, 3}) || d.Dtype() != tensor.Float32 {
		t.Fatalf("shape %v dtype %v", d.Shape(), d.Dtype())
	}
	if v, _ := d.At(1, 2); v.(float32) != 5 {
		t.Fatalf("At(1,2) = %v", v)
	}
	// Maths over the view: sum of 0..5.
	s, err := tensor.Sum(d)
	if err != nil || s.ScalarValue().(float32) != 15 {
		t.Fatalf("Sum = %v, %v", s, err)
	}
	// In-place maths writes through to the bytes.
	if _, err := d.MulScalar(float32(2), true, tensor.UseUnsafe()); err != nil {
		t.Fatal(err)
	}
	if got := math.Float32frombits(binary.NativeEndian.Uint32(buf[4*5:])); got != 10 {
		t.Fatalf("buf[5] after in-place doubling = %v", got)
	}
	// And writes to the bytes show through the tensor.
	binary.NativeEndian.PutUint32(buf[0:], math.Float32bits(-1))
	if v, _ := d.At(0, 0); v.(float32) != -1 {
		t.Fatalf("At(0,0) after writing buf = %v", v)
	}
}

func TestHostTensorErrors(t *testing.T) {
	buf := make([]byte, 32)
	for name, f := range map[string]func() error{
		"no shape":      func() error { _, err := HostTensor(buf); return err },
		"zero dim":      func() error { _, err := HostTensor(buf, 0, 8); return err },
		"size mismatch": func() error { _, err := HostTensor(buf, 3, 3); return err },
		"misaligned":    func() error { _, err := HostTensor(buf[1:29], 7); return err },
	} {
		if f() == nil {
			t.Errorf("%s: no error", name)
		}
	}
}
