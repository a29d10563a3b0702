package main

import "errors"

func conformanceCmd(args []string) error {
	return errors.New("conformance: not implemented yet")
}
